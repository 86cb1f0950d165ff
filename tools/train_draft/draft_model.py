"""The DSpark draft in torch with a reduced draft vocabulary (speculators names).

Adapted from tools/demo_pair/draft.py (same computation, as the runtime does it; see
../shared/reference/dflash-dspark-spec.md §2), with the output side over the Vd draft tokens only:

* ``ctx = hidden_norm(fc(concat(target residual streams entering the captured layers)))``;
* Qwen3-style layers (q/k norms, NeoX rope at the target's rope base): block queries see the
  context positions below the anchor and their whole block (non-causal inside the block);
* block input ``[anchor, MASK x (B-1)]`` embedded with the frozen target embedding, anchor-first:
  slot k predicts the token at p+1+k;
* ``lm_head`` [Vd, E] (frozen rows of the target head), vanilla Markov head ``markov_w1`` [V, r]
  (indexed by target ids), ``markov_w2`` [Vd, r]; confidence ``proj([h_k ; w1[prev_k]])``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DraftConfig:
    vocab_size: int          # target vocabulary V
    draft_vocab_size: int    # Vd
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    capture_ids: list        # residual stream entering these target layers (speculators convention)
    num_target_layers: int
    block_size: int
    mask_token_id: int
    markov_rank: int

    def to_dict(self):
        return asdict(self)


def feature_layer_ids(n_layer: int, n: int) -> list[int]:
    """Capture ids (layer-input convention) of n features: DeepSpec/z-lab's rule
    round(1 + i (L-4)/(n-1)) in the layer-output convention, plus one."""
    if n == 1:
        return [n_layer // 2 + 1]
    start, end = 1, n_layer - 3
    return [int(round(start + i * (end - start) / (n - 1))) + 1 for i in range(n)]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    fr = pos.float()[..., None] * inv
    emb = torch.cat([fr, fr], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    d = x.shape[-1] // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x * cos[:, None] + rot * sin[:, None]


class Attention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        H, Hk, D, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
        self.q_proj = nn.Linear(d, H * D, bias=False)
        self.k_proj = nn.Linear(d, Hk * D, bias=False)
        self.v_proj = nn.Linear(d, Hk * D, bias=False)
        self.o_proj = nn.Linear(H * D, d, bias=False)
        self.q_norm = RMSNorm(D, c.rms_norm_eps)
        self.k_norm = RMSNorm(D, c.rms_norm_eps)

    def kv(self, x, cos, sin):
        B, S, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, S, -1, self.c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, -1, self.c.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask):
        B, Q, _ = h.shape
        c = self.c
        q = self.q_norm(self.q_proj(h).view(B, Q, -1, c.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        bk, bv = self.kv(h, cos, sin)
        k = torch.cat([ctx_k, bk], dim=2)
        v = torch.cat([ctx_v, bv], dim=2)
        rep = c.num_attention_heads // c.num_key_value_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=c.head_dim ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    def __init__(self, vocab: int, rank: int, out_vocab: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, out_vocab, bias=False)

    def forward(self, prev):
        e = self.markov_w1(prev)
        return self.markov_w2(e), e


class ConfidenceHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, h, e):
        return self.proj(torch.cat([h.float(), e.float()], dim=-1)).squeeze(-1)


FROZEN = ("embed_tokens.weight", "lm_head.weight")


class DSparkDraft(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, d)
        self.lm_head = nn.Linear(d, c.draft_vocab_size, bias=False)
        self.fc = nn.Linear(len(c.capture_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank, c.draft_vocab_size)
        self.confidence_head = ConfidenceHead(d + c.markov_rank)
        self.register_buffer("vocab_ids", torch.zeros(c.draft_vocab_size, dtype=torch.long), persistent=False)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                nn.init.ones_(p)
            elif name.startswith("markov_head.markov_w2") or name == "confidence_head.proj.bias":
                nn.init.zeros_(p)  # no Markov correction at first
            else:
                nn.init.normal_(p, std=0.02)
        for n in FROZEN:
            self.get_parameter(n).requires_grad_(False)

    def set_vocab(self, vocab_ids: torch.Tensor, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Frozen target embedding [V, E] and the head rows of the draft tokens (sorted target ids)."""
        with torch.no_grad():
            self.vocab_ids.copy_(vocab_ids)
            self.embed_tokens.weight.copy_(embed)
            self.lm_head.weight.copy_(head[vocab_ids])

    # ---- pieces -----------------------------------------------------------------------------
    def context_kv(self, feats, pos):
        ctx = self.hidden_norm(self.fc(feats))
        cos, sin = rope_cos_sin(pos, self.c.head_dim, self.c.rope_theta)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def backbone(self, block_ids, block_pos, ctx_kv, mask):
        x = self.embed_tokens(block_ids)
        cos, sin = rope_cos_sin(block_pos, self.c.head_dim, self.c.rope_theta)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def heads(self, h, prev):
        bias, e = self.markov_head(prev)
        return self.lm_head(h) + bias, self.confidence_head(h, e)

    @torch.no_grad()
    def chain(self, h, anchors):
        """Argmax drafting as the runtime does it (greedy draft mode): h [N, A, B, E] final-normed
        block states, anchors [N, A] target ids. Returns draft tokens (target ids) [N, A, B] and
        confidence logits [N, A, B] (prev = the anchor, then the previous draft token)."""
        base = self.lm_head(h)
        prev = anchors
        toks, confs = [], []
        for k in range(h.shape[2]):
            bias, e = self.markov_head(prev)
            z = base[:, :, k] + bias
            confs.append(self.confidence_head(h[:, :, k], e))
            prev = self.vocab_ids[z.argmax(-1)]
            toks.append(prev)
        return torch.stack(toks, -1), torch.stack(confs, -1)


def attn_mask(anchor_pos: torch.Tensor, S: int, B: int) -> torch.Tensor:
    """[N, 1, Q, S+Q] bool: block queries see context keys t < anchor and their own block."""
    N, Q = anchor_pos.shape
    t = torch.arange(S)
    ctx = t[None, None, :] < anchor_pos[:, :, None]
    blk = torch.arange(Q) // B
    own = blk[:, None] == blk[None, :]
    return torch.cat([ctx, own[None].expand(N, Q, Q)], dim=-1)[:, None]


def count_params(m: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad or not trainable_only)
