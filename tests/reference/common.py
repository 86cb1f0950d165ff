"""Building blocks shared by the numpy target and draft references (float64 throughout).

Weight orientation: numpy [out, in] (gguf-py's shape, the ggml `ne` reversed), so `y = x @ W.T`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np


def rms_norm(x: np.ndarray, weight: Optional[np.ndarray], eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, times `weight` when given."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * weight if weight is not None else y


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate='tanh'); ggml_gelu)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


@dataclass
class RopeParams:
    """ggml_rope_ext's parameters, as llama.cpp derives them from the GGUF metadata.

    neox: rotate pairs (j, j + n_dims/2) (qwen2/qwen3/dflash); else pairs (2j, 2j+1) (llama).
    """

    n_dims: int
    freq_base: float
    neox: bool
    freq_scale: float = 1.0           # 1 / rope.scaling.factor
    ext_factor: float = 0.0           # 1 for YaRN, else 0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0               # rope.scaling.original_context_length (YaRN)
    freq_factors: Optional[np.ndarray] = None  # rope_freqs.weight [n_dims/2]: theta_j /= factor_j

    @classmethod
    def from_metadata(cls, n_dims: int, freq_base: float, neox: bool, scaling: Optional[tuple],
                      n_ctx_train: int, freq_factors: Optional[np.ndarray] = None) -> "RopeParams":
        """scaling: None | ("linear", factor) | ("yarn", factor, orig_ctx). Mirrors llama_context's
        set-up: YaRN gets ext_factor 1 and an attn_factor that cancels the magnitude term ggml adds,
        then multiplies in get_mscale(factor) = 1 + 0.1 ln(factor) (the same as HF's YaRN)."""
        p = cls(n_dims=n_dims, freq_base=freq_base, neox=neox, n_ctx_orig=n_ctx_train,
                freq_factors=None if freq_factors is None else np.asarray(freq_factors, np.float64))
        if scaling is None:
            return p
        factor = float(scaling[1])
        p.freq_scale = 1.0 / factor
        if scaling[0] == "yarn":
            p.ext_factor = 1.0
            p.n_ctx_orig = int(scaling[2])
            mscale = 1.0 if factor <= 1.0 else 1.0 + 0.1 * math.log(factor)
            p.attn_factor = mscale / (1.0 + 0.1 * math.log(factor))
        return p


def _yarn_corr_dims(p: RopeParams) -> tuple:
    """Pair-index range [low, high] over which YaRN ramps from extrapolation to interpolation."""
    def corr_dim(n_rot: float) -> float:
        return p.n_dims * math.log(p.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(p.freq_base))
    low = max(0.0, math.floor(corr_dim(p.beta_fast)))
    high = min(p.n_dims - 1.0, math.ceil(corr_dim(p.beta_slow)))
    return low, high


def rope_cos_sin(p: RopeParams, positions: np.ndarray) -> tuple:
    """cos, sin of every (position, pair): [T, n_dims/2] each, magnitude-scaled like ggml."""
    pair = np.arange(p.n_dims // 2, dtype=np.float64)                       # [P]
    theta_extrap = positions[:, None].astype(np.float64) * p.freq_base ** (-2.0 * pair / p.n_dims)
    if p.freq_factors is not None:
        theta_extrap = theta_extrap / p.freq_factors[None, :]
    theta_interp = p.freq_scale * theta_extrap
    theta, mscale = theta_interp, p.attn_factor
    if p.ext_factor != 0.0:
        low, high = _yarn_corr_dims(p)
        ramp = 1.0 - np.clip((pair - low) / max(0.001, high - low), 0.0, 1.0)  # 1 = keep extrapolated
        mix = ramp * p.ext_factor
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / p.freq_scale)
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def apply_rope(x: np.ndarray, positions: np.ndarray, p: RopeParams) -> np.ndarray:
    """x: [T, n_heads, D] -> same; only the first n_dims of each head rotate."""
    cos, sin = rope_cos_sin(p, positions)                   # [T, P]
    cos, sin = cos[:, None, :], sin[:, None, :]             # [T, 1, P]
    half = p.n_dims // 2
    out = x.copy()
    if p.neox:
        a, b = x[..., :half], x[..., half:p.n_dims]
        out[..., :half] = a * cos - b * sin
        out[..., half:p.n_dims] = a * sin + b * cos
    else:
        a, b = x[..., 0:p.n_dims:2], x[..., 1:p.n_dims:2]
        out[..., 0:p.n_dims:2] = a * cos - b * sin
        out[..., 1:p.n_dims:2] = a * sin + b * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float) -> np.ndarray:
    """Grouped-query attention.

    q [Tq, H, D], k/v [Tk, Hkv, D], allowed [Tq, Tk] bool (True: the query sees the key)
    -> [Tq, H*D]. Query head h uses KV head h // (H/Hkv), as in ggml's broadcasting.
    """
    n_head, n_head_kv = q.shape[1], k.shape[1]
    group = n_head // n_head_kv
    k = np.repeat(k, group, axis=1)                                     # [Tk, H, D]
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * scale                     # [H, Tq, Tk]
    scores = np.where(allowed[None, :, :], scores, -np.inf)
    probs = softmax(scores, axis=-1)
    out = np.einsum("hqk,khd->qhd", probs, v)                           # [Tq, H, D]
    return out.reshape(q.shape[0], -1)


def swiglu_ffn(h: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
               act=silu) -> np.ndarray:
    """down( act(gate h) * (up h) ): h [T, E] -> [T, E]."""
    return (act(h @ w_gate.T) * (h @ w_up.T)) @ w_down.T
