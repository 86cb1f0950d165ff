"""Running the HF target: load it, and capture the hidden states the draft is fed.

DeepSpec convention: target layer id L means the OUTPUT of decoder layer L (0-based), i.e. HF
``output_hidden_states[L + 1]``, the raw residual stream before the final norm. We capture it
with forward hooks on the decoder layers, so there is no doubt about which entry is meant.
"""

from __future__ import annotations

import os

import torch


def load_target(target_dir: str):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class FeatureTap:
    """Forward hooks that keep the outputs of the chosen decoder layers of the last call."""

    def __init__(self, model, layer_ids):
        self.layer_ids = list(layer_ids)
        self.store = {}
        self.handles = []
        for lid in self.layer_ids:
            layer = model.model.layers[lid]
            self.handles.append(layer.register_forward_hook(self._hook(lid)))

    def _hook(self, lid):
        def fn(module, inputs, output):
            self.store[lid] = output[0] if isinstance(output, tuple) else output
        return fn

    def features(self) -> torch.Tensor:
        """[B, S, n*d] concatenation in target_layer_ids order."""
        return torch.cat([self.store[lid] for lid in self.layer_ids], dim=-1)

    def remove(self):
        for h in self.handles:
            h.remove()


def tokenizer_path(target_dir: str) -> str:
    return os.path.join(target_dir, "tokenizer.json")


class FastTarget:
    """A minimal Qwen3 forward with a preallocated KV cache, reading the HF model's weights.

    The HF forward costs ~50 ms of Python overhead per call on a 2-core machine; this one a few ms,
    which matters for token-by-token generation and for the speculative loop. Checked against the
    HF logits in selftest().
    """

    def __init__(self, model, tap_ids=(), max_len: int = 2048):
        cfg = model.config
        self.cfg = cfg
        self.H = cfg.num_attention_heads
        self.Hk = cfg.num_key_value_heads
        self.D = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.tap_ids = list(tap_ids)
        m = model.model
        self.embed = m.embed_tokens.weight.detach()
        self.head = model.lm_head.weight.detach()
        self.norm = m.norm.weight.detach()
        self.layers = []
        for L in m.layers:
            a = L.self_attn
            self.layers.append(dict(
                ln1=L.input_layernorm.weight.detach(), ln2=L.post_attention_layernorm.weight.detach(),
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)
                .detach().t().contiguous(),
                wo=a.o_proj.weight.detach().t().contiguous(),
                qn=a.q_norm.weight.detach(), kn=a.k_norm.weight.detach(),
                wgu=torch.cat([L.mlp.gate_proj.weight, L.mlp.up_proj.weight], 0).detach().t().contiguous(),
                wd=L.mlp.down_proj.weight.detach().t().contiguous(),
            ))
        theta = cfg.rope_parameters["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, self.D, 2, dtype=torch.float32) / self.D))
        fr = torch.arange(max_len, dtype=torch.float32)[:, None] * inv
        emb = torch.cat([fr, fr], -1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.max_len = max_len
        self.inter = cfg.intermediate_size

    def new_cache(self, batch: int):
        n = len(self.layers)
        return {"k": torch.zeros(n, batch, self.Hk, self.max_len, self.D),
                "v": torch.zeros(n, batch, self.Hk, self.max_len, self.D), "len": 0}

    def _rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x, cos, sin):
        d = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., d:], x[..., :d]], -1) * sin

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache, want_logits: str = "all"):
        """ids [B, S] appended at cache['len']. Returns (logits [B, S or 1, V], feats [B, S, n*d],
        final_hidden [B, S, d]). want_logits: 'all' or 'last'."""
        B, S = ids.shape
        p0 = cache["len"]
        assert p0 + S <= self.max_len
        x = self.embed[ids]
        cos = self.cos[p0:p0 + S][None, None]
        sin = self.sin[p0:p0 + S][None, None]
        mask = None
        if S > 1:
            kpos = torch.arange(p0 + S)
            qpos = torch.arange(p0, p0 + S)
            mask = (kpos[None, :] <= qpos[:, None])[None, None]
        taps = {}
        H, Hk, D = self.H, self.Hk, self.D
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            qkv = h @ L["wqkv"]
            q = qkv[..., :H * D].view(B, S, H, D)
            k = qkv[..., H * D:(H + Hk) * D].view(B, S, Hk, D)
            v = qkv[..., (H + Hk) * D:].view(B, S, Hk, D)
            q = self._rope(self._rms(q, L["qn"]).transpose(1, 2), cos, sin)
            k = self._rope(self._rms(k, L["kn"]).transpose(1, 2), cos, sin)
            cache["k"][li, :, :, p0:p0 + S] = k
            cache["v"][li, :, :, p0:p0 + S] = v.transpose(1, 2)
            K = cache["k"][li, :, :, :p0 + S]
            V = cache["v"][li, :, :, :p0 + S]
            o = torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=mask, enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(B, S, H * D) @ L["wo"]
            h = self._rms(x, L["ln2"])
            gu = h @ L["wgu"]
            x = x + (torch.nn.functional.silu(gu[..., :self.inter]) * gu[..., self.inter:]) @ L["wd"]
            if li in self.tap_ids:
                taps[li] = x
        cache["len"] = p0 + S
        hf = self._rms(x, self.norm)
        logits = (hf[:, -1:] if want_logits == "last" else hf) @ self.head.t()
        feats = torch.cat([taps[i] for i in self.tap_ids], -1) if self.tap_ids else None
        return logits, feats, hf

    def selftest(self, model, tol: float = 1e-3):
        ids = torch.randint(0, self.cfg.vocab_size - 8, (2, 37), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = model(input_ids=ids).logits
        c = self.new_cache(2)
        a, _, _ = self.forward(ids[:, :30], c)
        b, _, _ = self.forward(ids[:, 30:31], c)
        d, _, _ = self.forward(ids[:, 31:], c)
        got = torch.cat([a, b, d], 1)
        err = (got - ref).abs().max().item()
        assert err < tol, f"FastTarget mismatch {err}"
        return err
