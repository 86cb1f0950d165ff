"""Gemma-4 text decoders: the hyperparameters of a `gemma4_text` config and the keys they become.

Gemma-4 interleaves sliding-window and full ("global") attention layers that differ in head size
and KV heads, rotates only part of the global heads ("proportional" rope), may share the KV of
the last layers with earlier ones, and optionally adds per-layer inputs (PLE) and a routed
expert block next to the dense MLP. `Gemma4Text` holds all of it, read from either config style
transformers has written: `global_head_dim` / `num_global_key_value_heads`, or the
`per_layer_config` overrides that transformers 5.2x serialises instead.

Used for Gemma-4 targets (`gemma4` architecture, keys as llama.cpp's converter writes them) and
for the backbone of Gemma-4 DSpark drafts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from gguf import GGUFValueType

from . import gguf_keys as K
from .errors import ConversionError
from .hf_config import Config
from .metadata import KeyValues

FULL, SLIDING = "full_attention", "sliding_attention"
ACTIVATION = "gelu_pytorch_tanh"  # the only FFN activation of Gemma-4 (and of the runtime)
UNROTATED = 1e30  # rope frequency divisor that leaves a dimension pair unrotated


@dataclass(frozen=True)
class Experts:
    count: int
    used: int
    n_ff: int


@dataclass(frozen=True)
class Gemma4Text:
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    sliding: tuple[bool, ...]  # per layer
    head_dim_swa: int
    head_dim_full: int
    kv_heads_swa: int
    kv_heads_full: Optional[int]  # None: not stated (same as the sliding layers')
    window: Optional[int]
    rope_theta_full: float
    rope_theta_swa: Optional[float]
    rotary_fraction_full: Optional[float]  # None: plain rope over the whole global head
    rms_eps: float
    final_softcap: Optional[float]
    n_kv_shared: int
    n_embd_per_layer: int  # 0: no per-layer inputs
    double_wide_mlp: bool
    experts: Optional[Experts]
    k_eq_v: bool
    vocab_size: int
    vocab_size_per_layer: int
    tie_word_embeddings: bool

    def head_dim(self, layer: int) -> int:
        return self.head_dim_swa if self.sliding[layer] else self.head_dim_full

    def kv_heads(self, layer: int) -> int:
        if self.sliding[layer] or self.kv_heads_full is None:
            return self.kv_heads_swa
        return self.kv_heads_full

    def owns_kv(self, layer: int) -> bool:
        """False for the last `n_kv_shared` layers, which reuse an earlier layer's K and V."""
        return layer < self.n_layer - self.n_kv_shared

    def has_v_proj(self, layer: int) -> bool:
        # with attention_k_eq_v the global layers take V from the K projection
        return self.owns_kv(layer) and not (self.k_eq_v and not self.sliding[layer])

    def n_ff_of(self, layer: int) -> int:
        return self.n_ff * (2 if self.double_wide_mlp and not self.owns_kv(layer) else 1)


# ----------------------------------------------------------------------------------------------
# reading


def _layer_types(cfg: Config, n_layer: int) -> list[str]:
    types = cfg.str_list("layer_types")
    if len(types) != n_layer or not set(types) <= {FULL, SLIDING}:
        raise ConversionError(f"{cfg.where}: field 'layer_types' should list '{FULL}' or "
                              f"'{SLIDING}' for each of the {n_layer} layers")
    if types[-1] != FULL:
        # transformers silently makes it one; say so rather than convert something else
        raise ConversionError(f"{cfg.where}: field 'layer_types': the last layer must be "
                              f"'{FULL}' (transformers forces it)")
    return types


def _per_layer_overrides(cfg: Config) -> dict[int, Config]:
    """`per_layer_config` by layer index. transformers writes the keys zero-padded to the width
    of the largest index ("05" in a 12-layer model), so they are read as numbers."""
    overrides = cfg.sub("per_layer_config")
    out: dict[int, Config] = {}
    for key in (overrides.data if overrides is not None else {}):
        if str(key).isdigit():
            layer = overrides.sub(key)
            if layer is not None:
                out[int(key)] = layer
    return out


def _per_layer(cfg: Config, types: list[str], key: str, default: Optional[int],
               global_key: str) -> tuple[Optional[int], Optional[int]]:
    """(sliding value, full value) of a per-layer attention size: `per_layer_config` overrides
    where present, else `global_key` for the full layers and `default` for the sliding ones
    (None: not stated; transformers would assume a size for the full layers, we do not). Layers
    of one type must agree (one GGUF key per type)."""
    by_layer = _per_layer_overrides(cfg)
    found: dict[str, set] = {SLIDING: set(), FULL: set()}
    for i, kind in enumerate(types):
        layer = by_layer.get(i)
        value = layer.int(key, None, minimum=1) if layer is not None else None
        if value is None:
            value = cfg.int(global_key, None, minimum=1) if kind == FULL else None
        found[kind].add(value if value is not None or kind == FULL else default)
    for kind, values in found.items():
        if len(values) > 1:
            raise ConversionError(f"{cfg.where}: the {kind} layers have different {key} "
                                  f"({sorted(v for v in values if v is not None)}); GGUF has one "
                                  "value per layer type")
    pick = {kind: next(iter(values)) if values else None for kind, values in found.items()}
    return pick[SLIDING], pick[FULL]


def _rope(cfg: Config, types: list[str]) -> tuple[float, Optional[float], Optional[float]]:
    """(global theta, sliding theta, rotated fraction of the global head or None for all)."""
    rope = cfg.sub("rope_parameters")
    if rope is None or (FULL not in rope.data and SLIDING not in rope.data):
        raise ConversionError(f"{cfg.where}: field 'rope_parameters' should have "
                              f"'{FULL}' and '{SLIDING}' entries")
    full, sliding = rope.sub(FULL), rope.sub(SLIDING)
    if full is None and FULL in types or sliding is None and SLIDING in types:
        raise ConversionError(f"{rope.where}: a rope entry is missing for a layer type in use")
    fraction = None
    theta_full = 1_000_000.0  # transformers' default for the global layers
    if full is not None:
        kind = full.str("rope_type", "default")
        if kind not in ("default", "proportional"):
            raise ConversionError(f"{full.where}: field 'rope_type' {kind!r} is not supported "
                                  "(default or proportional)")
        theta_full = full.float("rope_theta", theta_full)
        if kind == "proportional":
            fraction = full.float("partial_rotary_factor", 1.0)
    theta_swa = None
    if sliding is not None:
        if sliding.str("rope_type", "default") != "default":
            raise ConversionError(f"{sliding.where}: field 'rope_type' should be 'default' for "
                                  "the sliding layers")
        if sliding.float("partial_rotary_factor", 1.0) != 1.0:
            raise ConversionError(f"{sliding.where}: field 'partial_rotary_factor' is not "
                                  "supported for the sliding layers")
        theta_swa = sliding.float("rope_theta", None)
    return theta_full, theta_swa, fraction


def _experts(cfg: Config) -> Optional[Experts]:
    if not cfg.bool("enable_moe_block", False):
        return None
    return Experts(cfg.int("num_experts", minimum=1), cfg.int("top_k_experts", minimum=1),
                   cfg.int("moe_intermediate_size", minimum=1))


def _refuse_unsupported(cfg: Config) -> None:
    if cfg.str("hidden_activation", ACTIVATION) != ACTIVATION:
        raise ConversionError(f"{cfg.where}: field 'hidden_activation' should be {ACTIVATION!r}")
    if cfg.bool("attention_bias", False):
        raise ConversionError(f"{cfg.where}: field 'attention_bias': projection biases are not "
                              "supported for Gemma-4")
    if cfg.has("attn_logit_softcapping"):
        raise ConversionError(f"{cfg.where}: field 'attn_logit_softcapping' is not supported "
                              "(Gemma-4 has no attention soft-capping)")
    if cfg.str("use_bidirectional_attention", "vision") != "vision":
        raise ConversionError(f"{cfg.where}: field 'use_bidirectional_attention' 'all' (a "
                              "bidirectional text model) is not supported")


def read_gemma4(cfg: Config) -> Gemma4Text:
    """Hyperparameters of a `gemma4_text` config (for the conditional model: its text_config)."""
    _refuse_unsupported(cfg)
    n_layer = cfg.int("num_hidden_layers", minimum=1)
    types = _layer_types(cfg, n_layer)
    head_swa, head_full = _per_layer(cfg, types, "head_dim", cfg.int("head_dim", minimum=1),
                                     "global_head_dim")
    kv_swa, kv_full = _per_layer(cfg, types, "num_key_value_heads", None,
                                 "num_global_key_value_heads")
    if head_full is None:
        raise ConversionError(f"{cfg.where}: the head size of the full-attention layers is not "
                              "stated (global_head_dim or per_layer_config)")
    theta_full, theta_swa, fraction = _rope(cfg, types)
    n_kv_shared = cfg.int("num_kv_shared_layers", 0, minimum=0)
    if n_kv_shared >= n_layer:
        raise ConversionError(f"{cfg.where}: field 'num_kv_shared_layers' {n_kv_shared} leaves "
                              "no layer that computes its own KV")
    vocab = cfg.int("vocab_size", minimum=1)
    g = Gemma4Text(
        n_layer=n_layer, n_ctx=cfg.int("max_position_embeddings", minimum=1),
        n_embd=cfg.int("hidden_size", minimum=1), n_ff=cfg.int("intermediate_size", minimum=1),
        n_head=cfg.int("num_attention_heads", minimum=1),
        sliding=tuple(t == SLIDING for t in types), head_dim_swa=head_swa,
        head_dim_full=head_full, kv_heads_swa=kv_swa or cfg.int("num_key_value_heads", minimum=1),
        kv_heads_full=kv_full, window=cfg.int("sliding_window", None, minimum=1),
        rope_theta_full=theta_full, rope_theta_swa=theta_swa, rotary_fraction_full=fraction,
        rms_eps=cfg.float("rms_norm_eps"),
        final_softcap=cfg.float("final_logit_softcapping", None) or None,
        n_kv_shared=n_kv_shared, n_embd_per_layer=cfg.int("hidden_size_per_layer_input", 0),
        double_wide_mlp=cfg.bool("use_double_wide_mlp", False), experts=_experts(cfg),
        k_eq_v=cfg.bool("attention_k_eq_v", False), vocab_size=vocab,
        vocab_size_per_layer=cfg.int("vocab_size_per_layer_input", vocab, minimum=1),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", True),
    )
    if any(g.sliding) and g.window is None:
        raise ConversionError(f"{cfg.where}: sliding-window layers but no field 'sliding_window'")
    for kv in (g.kv_heads_swa, g.kv_heads_full or g.kv_heads_swa):
        if g.n_head % kv:
            raise ConversionError(f"{cfg.where}: num_attention_heads {g.n_head} is not a "
                                  f"multiple of the KV heads {kv}")
    rope_freqs(g)  # validates the rotated fraction
    return g


# ----------------------------------------------------------------------------------------------
# writing


def rope_freqs(g: Gemma4Text) -> Optional[np.ndarray]:
    """Per-pair frequency divisors of the global layers' proportional rope (`rope_freqs.weight`):
    the first pairs rotate as usual, the rest get a divisor so large they stay put. None when the
    whole head rotates."""
    if g.rotary_fraction_full is None:
        return None
    pairs = g.head_dim_full // 2
    rotated = int(g.head_dim_full * g.rotary_fraction_full / 2)
    if not 0 < rotated <= pairs:
        raise ConversionError(f"partial_rotary_factor {g.rotary_fraction_full} of the global "
                              f"layers rotates no dimension of their {g.head_dim_full}-wide heads")
    return np.array([1.0] * rotated + [UNROTATED] * (pairs - rotated), dtype=np.float32)


def write_gemma4_kv(g: Gemma4Text, kv: KeyValues) -> None:
    """The hyperparameter keys of the `gemma4` architecture, as llama.cpp's converter writes them.

    key_length / rope.dimension_count describe the global layers, the *_swa keys the sliding
    ones; head_count_kv and feed_forward_length become per-layer arrays when they vary."""
    kv.u32(K.BLOCK_COUNT, g.n_layer)
    kv.u32(K.CONTEXT_LENGTH, g.n_ctx)
    kv.u32(K.EMBEDDING_LENGTH, g.n_embd)
    if g.double_wide_mlp:
        kv.array(K.FEED_FORWARD_LENGTH, [g.n_ff_of(i) for i in range(g.n_layer)],
                 GGUFValueType.INT32)
    else:
        kv.u32(K.FEED_FORWARD_LENGTH, g.n_ff)
    kv.u32(K.HEAD_COUNT, g.n_head)
    if g.kv_heads_full is not None:
        kv.array(K.HEAD_COUNT_KV, [g.kv_heads(i) for i in range(g.n_layer)], GGUFValueType.INT32)
    else:
        kv.u32(K.HEAD_COUNT_KV, g.kv_heads_swa)
    kv.f32(K.ROPE_FREQ_BASE, g.rope_theta_full)
    if g.rope_theta_swa is not None:
        kv.f32(K.ROPE_FREQ_BASE_SWA, g.rope_theta_swa)
    kv.f32(K.RMS_EPS, g.rms_eps)
    if g.experts is not None:
        kv.u32(K.EXPERT_COUNT, g.experts.count)
        kv.u32(K.EXPERT_USED_COUNT, g.experts.used)
        kv.u32(K.EXPERT_FEED_FORWARD_LENGTH, g.experts.n_ff)
    kv.u32(K.KEY_LENGTH, g.head_dim_full)
    kv.u32(K.VALUE_LENGTH, g.head_dim_full)
    kv.u32(K.KEY_LENGTH_SWA, g.head_dim_swa)
    kv.u32(K.VALUE_LENGTH_SWA, g.head_dim_swa)
    if g.final_softcap is not None:
        kv.f32(K.FINAL_LOGIT_SOFTCAPPING, g.final_softcap)
    if g.window is not None:
        kv.u32(K.SLIDING_WINDOW, g.window)
    kv.array(K.SLIDING_WINDOW_PATTERN, list(g.sliding), GGUFValueType.BOOL)
    kv.u32(K.SHARED_KV_LAYERS, g.n_kv_shared)
    kv.u32(K.EMBEDDING_LENGTH_PER_LAYER_INPUT, g.n_embd_per_layer)
    # the whole global head goes through rope; rope_freqs keeps the unrotated part in place
    kv.u32(K.ROPE_DIMENSION_COUNT, g.head_dim_full)
    kv.u32(K.ROPE_DIMENSION_COUNT_SWA, g.head_dim_swa)
