"""A DSpark draft model in plain torch (own implementation), with DeepSpec parameter names.

Architecture (as the runtime computes it, see the project's dflash-dspark spec §2):

* ``ctx = hidden_norm(fc(concat(target hidden states at target_layer_ids)))`` per context token.
* ``num_hidden_layers`` Qwen3-style decoder layers. Block queries attend to keys/values made from
  [context tokens ; block tokens] with each layer's own k_proj/v_proj (k_norm + RoPE on K, no input
  norm on the context features). A block sees only context positions < its anchor position and every
  slot of its own block (non-causal inside the block).
* Block input = [anchor, MASK x (B-1)] embedded with the frozen target embedding, positions p..p+B-1.
* ``h = norm(x)``, base logits ``U = lm_head(h)`` (frozen copy of the target head).
* Vanilla Markov head: ``z_k = U_k + markov_w2(markov_w1[prev_k])``, prev_0 = anchor,
  prev_k = token of slot k-1.
* Confidence head: ``c_k = sigmoid(proj([h_k ; markov_w1[prev_k]]))``.
* Anchor-first: slot k predicts the token at p+1+k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DraftConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: list
    num_target_layers: int
    block_size: int
    mask_token_id: int
    markov_rank: int

    def to_dict(self):
        return asdict(self)


def deepspec_layer_ids(num_target_layers: int, n: int) -> list[int]:
    """DeepSpec / z-lab ``build_target_layer_ids``: n ids spread over [1, L-3]."""
    if n == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (n - 1))) for i in range(n)]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    fr = pos.float()[..., None] * inv  # [..., D/2]
    emb = torch.cat([fr, fr], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: [B, H, S, D]; cos/sin: [B, S, D]  (NeoX / HF rotate_half layout)
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
        """K/V for x [B, S, d] at rope (cos, sin) -> [B, Hk, S, D] each."""
        B, S, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, S, -1, self.c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, -1, self.c.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask):
        """h: block hidden [B, Q, d] (already input-normed). ctx_k/v: [B, Hk, T, D].
        mask: bool [B or 1, 1, Q, T+Q] (True = may attend) or None (attend to everything)."""
        B, Q, _ = h.shape
        c = self.c
        q = self.q_norm(self.q_proj(h).view(B, Q, -1, c.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        bk, bv = self.kv(h, cos, sin)
        k = torch.cat([ctx_k, bk], dim=2)
        v = torch.cat([ctx_v, bv], dim=2)
        rep = c.num_attention_heads // c.num_key_value_heads
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
    def __init__(self, vocab: int, rank: int, out_vocab: int | None = None):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, out_vocab or vocab, bias=False)

    def forward(self, prev):
        e = self.markov_w1(prev)
        return self.markov_w2(e), e


class ConfidenceHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)

    def forward(self, h, e):
        return self.proj(torch.cat([h.float(), e.float()], dim=-1)).squeeze(-1)


class DSparkDraft(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        d = c.hidden_size
        n = len(c.target_layer_ids)
        self.embed_tokens = nn.Embedding(c.vocab_size, d)
        self.lm_head = nn.Linear(d, c.vocab_size, bias=False)
        self.fc = nn.Linear(n * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank)
        self.confidence_head = ConfidenceHead(d + c.markov_rank)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                nn.init.ones_(p)
            elif name.startswith("markov_head.markov_w2"):
                nn.init.zeros_(p)  # start as "no Markov correction"
            elif name == "confidence_head.proj.bias":
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)

    def load_target(self, target) -> None:
        """Copy (and freeze) the target's embedding and LM head."""
        emb = target.get_input_embeddings().weight.detach()
        head = target.get_output_embeddings().weight.detach()
        with torch.no_grad():
            self.embed_tokens.weight.copy_(emb)
            self.lm_head.weight.copy_(head)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    # ---- pieces -----------------------------------------------------------------------------
    def context(self, feats):
        """feats [B, T, n*d] (concatenated target hidden states) -> ctx [B, T, d]."""
        return self.hidden_norm(self.fc(feats))

    def context_kv(self, ctx, pos):
        """Per-layer (k, v) of the context tokens at positions pos [B, T]."""
        cos, sin = rope_cos_sin(pos, self.c.head_dim, self.c.rope_theta)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def backbone(self, block_ids, block_pos, ctx_kv, mask):
        """block_ids/pos [B, Q]; returns the final-normed hidden states h [B, Q, d]."""
        x = self.embed_tokens(block_ids)
        cos, sin = rope_cos_sin(block_pos, self.c.head_dim, self.c.rope_theta)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def heads(self, h, prev):
        """Markov-corrected logits and confidence logits for slots with previous tokens prev."""
        bias, e = self.markov_head(prev)
        logits = self.lm_head(h) + bias
        conf = self.confidence_head(h, e)
        return logits, conf

    # ---- inference: one block for one sequence --------------------------------------------
    @torch.no_grad()
    def propose(self, ctx_kv, anchor: int, pos0: int, temperature: float = 0.0, generator=None):
        """Draft B tokens after `anchor` at position pos0. ctx_kv covers positions < pos0.
        Returns (tokens [B], q-probs [B, V] (softmax(z/T); one-hot at T=0), confidences [B])."""
        c = self.c
        ids = torch.full((1, c.block_size), c.mask_token_id, dtype=torch.long)
        ids[0, 0] = anchor
        pos = torch.arange(pos0, pos0 + c.block_size)[None]
        h = self.backbone(ids, pos, ctx_kv, None)[0]
        base = self.lm_head(h)  # [B, V]
        vmask = getattr(self, "vocab_mask", None)
        prev = anchor
        toks, qs, confs = [], [], []
        for k in range(c.block_size):
            bias, e = self.markov_head(torch.tensor([prev]))
            z = base[k] + bias[0]
            if vmask is not None:  # reduced draft vocabulary: tokens outside it cannot be drafted
                z = z.masked_fill(~vmask, float("-inf"))
            confs.append(torch.sigmoid(self.confidence_head(h[k:k + 1], e)).item())
            if temperature <= 0:
                t = int(torch.argmax(z))
                q = torch.zeros_like(z)
                q[t] = 1.0
            else:
                q = torch.softmax(z / temperature, dim=-1)
                t = int(torch.multinomial(q, 1, generator=generator))
            toks.append(t)
            qs.append(q)
            prev = t
        return toks, torch.stack(qs), confs


def count_params(m: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad or not trainable_only)


def load_hf_draft(path: str) -> DSparkDraft:
    """Load an exported draft (DeepSpec dense or speculators format) back into DSparkDraft.
    A reduced vocabulary (speculators d2t) becomes full-size lm_head/markov_w2 with the draft rows
    scattered to their target ids and `vocab_mask` marking them."""
    import json
    import os

    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    sd = load_file(os.path.join(path, "model.safetensors"))
    if "speculators_model_type" in cfg:
        lc = cfg["transformer_layer_config"]
        ids = [i - 1 for i in cfg["aux_hidden_state_layer_ids"]]
        assert cfg.get("sample_from_anchor") is True
        n_target = None
    else:
        lc = cfg
        ids = cfg["target_layer_ids"]
        n_target = cfg["num_target_layers"]
    c = DraftConfig(
        vocab_size=lc["vocab_size"], hidden_size=lc["hidden_size"], intermediate_size=lc["intermediate_size"],
        num_hidden_layers=lc["num_hidden_layers"], num_attention_heads=lc["num_attention_heads"],
        num_key_value_heads=lc["num_key_value_heads"], head_dim=lc["head_dim"],
        rms_norm_eps=lc["rms_norm_eps"],
        rope_theta=float(lc["rope_parameters"]["rope_theta"]), target_layer_ids=ids,
        num_target_layers=n_target or 0, block_size=cfg["block_size"], mask_token_id=cfg["mask_token_id"],
        markov_rank=cfg["markov_rank"],
    )
    d = DSparkDraft(c)
    vmask = None
    if "d2t" in sd:
        Vd = sd["d2t"].shape[0]
        tid = torch.arange(Vd, dtype=torch.long) + sd.pop("d2t").long()
        t2d = sd.pop("t2d", None)
        V = c.vocab_size
        if t2d is not None:
            assert int(t2d.sum()) == Vd and bool(t2d[tid].all())
        head = torch.zeros(V, c.hidden_size)
        head[tid] = sd["lm_head.weight"]
        w2 = torch.zeros(V, c.markov_rank)
        w2[tid] = sd["markov_head.markov_w2.weight"]
        sd["lm_head.weight"], sd["markov_head.markov_w2.weight"] = head, w2
        vmask = torch.zeros(V, dtype=torch.bool)
        vmask[tid] = True
    d.load_state_dict(sd, strict=True)
    if vmask is not None:
        d.vocab_mask = vmask
    d.eval()
    return d
