"""Plain-numpy reference of the target LLMs (qwen3, llama, qwen2) as llama.cpp runs them.

One sequence, full causal attention over a stored KV history, so `forward` can be called
incrementally (prefill, then a token at a time) and `truncate` rolls the history back.

Dimensions: T tokens in the call, N cells in the history, E n_embd, V n_vocab, H/Hkv heads,
D head_dim, F n_ff. Weights are numpy [out, in] (tests/tiny_models.py's orientation): y = x @ W.T.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Tuple

import numpy as np
from tests.tiny_models import TargetConfig

from .common import RopeParams, apply_rope, attention, rms_norm, swiglu_ffn


def target_rope(cfg: TargetConfig, weights: Mapping[str, np.ndarray]) -> RopeParams:
    """NEOX rope for qwen2/qwen3; normal rope (pairs 2j, 2j+1) for llama, whose GGUF q/k rows are
    stored permuted by the converter for exactly that."""
    return RopeParams.from_metadata(
        n_dims=cfg.head_dim, freq_base=cfg.rope_theta, neox=cfg.arch != "llama",
        scaling=cfg.rope_scaling, n_ctx_train=cfg.n_ctx_train,
        freq_factors=weights.get("rope_freqs.weight"))


class TargetRef:
    """forward(tokens, positions) -> (logits [T, V], layer_inputs {L: [T, E]}).

    layer_inputs[L] is the residual stream entering layer L (L = 0: the token embeddings), as
    llama.cpp's t_layer_inp, for L in 0..n_layer-1; layer_inputs[n_layer] is the last layer's
    output (before output_norm).
    """

    def __init__(self, weights: Mapping[str, np.ndarray], cfg: TargetConfig):
        self.cfg = cfg
        self.w = {name: np.asarray(t, dtype=np.float64) for name, t in weights.items()}
        self.rope = target_rope(cfg, weights)
        head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
        self.head = self.w[head]                                               # [V, E]
        D, Hkv = cfg.head_dim, cfg.n_head_kv
        self.cache_k = [np.zeros((0, Hkv, D)) for _ in range(cfg.n_layer)]   # [N, Hkv, D] per layer
        self.cache_v = [np.zeros((0, Hkv, D)) for _ in range(cfg.n_layer)]
        self.cache_pos = np.zeros(0, dtype=np.int64)                          # [N]

    @property
    def n_cached(self) -> int:
        return int(self.cache_pos.size)

    def truncate(self, n_keep: int) -> None:
        """Drop every history cell at position >= n_keep."""
        keep = self.cache_pos < n_keep
        self.cache_pos = self.cache_pos[keep]
        self.cache_k = [k[keep] for k in self.cache_k]
        self.cache_v = [v[keep] for v in self.cache_v]

    def forward(self, tokens, positions) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
        tokens = np.asarray(tokens, dtype=np.int64)                           # [T]
        positions = np.asarray(positions, dtype=np.int64)                     # [T]
        if np.intersect1d(positions, self.cache_pos).size:
            raise ValueError("positions already in the history: truncate first")
        x = self.w["token_embd.weight"][tokens]                              # [T, E]
        layer_inputs: Dict[int, np.ndarray] = {}
        for il in range(self.cfg.n_layer):
            layer_inputs[il] = x.copy()
            x = self._layer(il, x, positions)
        layer_inputs[self.cfg.n_layer] = x.copy()
        self.cache_pos = np.concatenate([self.cache_pos, positions])
        h = rms_norm(x, self.w["output_norm.weight"], self.cfg.rms_eps)       # [T, E]
        return h @ self.head.T, layer_inputs                                  # [T, V]

    def generate_greedy(self, prompt, n_new: int) -> List[int]:
        """Target-only greedy decoding from an empty history: the lossless-speculation oracle."""
        if self.n_cached:
            raise ValueError("generate_greedy starts from an empty history")
        logits, _ = self.forward(prompt, np.arange(len(prompt)))
        out = [int(np.argmax(logits[-1]))]
        while len(out) < n_new:
            logits, _ = self.forward([out[-1]], [len(prompt) + len(out) - 1])
            out.append(int(np.argmax(logits[-1])))
        return out[:n_new]

    def _layer(self, il: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, T = self.cfg, x.shape[0]
        H, Hkv, D = cfg.n_head, cfg.n_head_kv, cfg.head_dim

        def w(name: str) -> np.ndarray:
            return self.w[f"blk.{il}.{name}"]

        # attention
        h = rms_norm(x, w("attn_norm.weight"), cfg.rms_eps)                  # [T, E]
        q, k, v = h @ w("attn_q.weight").T, h @ w("attn_k.weight").T, h @ w("attn_v.weight").T
        if cfg.arch == "qwen2":
            q, k, v = q + w("attn_q.bias"), k + w("attn_k.bias"), v + w("attn_v.bias")
        q, k, v = q.reshape(T, H, D), k.reshape(T, Hkv, D), v.reshape(T, Hkv, D)
        if cfg.arch == "qwen3":  # per-head RMSNorm of q and k, before rope
            q = rms_norm(q, w("attn_q_norm.weight"), cfg.rms_eps)
            k = rms_norm(k, w("attn_k_norm.weight"), cfg.rms_eps)
        q, k = apply_rope(q, positions, self.rope), apply_rope(k, positions, self.rope)

        self.cache_k[il] = np.concatenate([self.cache_k[il], k])             # [N, Hkv, D]
        self.cache_v[il] = np.concatenate([self.cache_v[il], v])
        key_pos = np.concatenate([self.cache_pos, positions])                # [N]
        allowed = key_pos[None, :] <= positions[:, None]                     # [T, N] causal
        attn = attention(q, self.cache_k[il], self.cache_v[il], allowed, 1.0 / math.sqrt(D))
        x = x + attn @ w("attn_output.weight").T                              # [T, E]

        # feed-forward (SwiGLU)
        h = rms_norm(x, w("ffn_norm.weight"), cfg.rms_eps)
        return x + swiglu_ffn(h, w("ffn_gate.weight"), w("ffn_up.weight"), w("ffn_down.weight"))
