"""Decoder hyperparameters of a Qwen2/Qwen3/Llama-style config and the GGUF keys they become.

Used for targets and for the backbone of drafts (whose keys go under the `dflash.` prefix).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import gguf_keys as K
from .errors import ConversionError
from .hf_config import Config
from .metadata import KeyValues


@dataclass(frozen=True)
class RopeScaling:
    """Rope scaling from `rope_parameters` / `rope_scaling`; kind "none" when there is none."""

    kind: str  # "none" | "linear" | "yarn" | "llama3"
    factor: Optional[float] = None
    original_context_length: Optional[int] = None
    yarn_ext_factor: Optional[float] = None
    yarn_attn_factor: Optional[float] = None
    yarn_beta_fast: Optional[float] = None
    yarn_beta_slow: Optional[float] = None
    low_freq_factor: Optional[float] = None
    high_freq_factor: Optional[float] = None


@dataclass(frozen=True)
class Backbone:
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: Optional[int]  # None: not in the config (the runtime then uses n_head)
    explicit_head_dim: Optional[int]  # `head_dim` as written in the config
    rms_eps: float
    rope_theta: Optional[float]
    rope: RopeScaling
    partial_rotary_factor: Optional[float]
    vocab_size: int
    tie_word_embeddings: bool
    is_causal: Optional[bool]

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head_kv or self.n_head


def _rope_dict(cfg: Config) -> Config:
    for key in ("rope_parameters", "rope_scaling"):
        sub = cfg.sub(key)
        if sub is not None:
            return sub
    return Config({}, f"{cfg.where}: rope_parameters")


def _rope_theta(cfg: Config, rope: Config) -> Optional[float]:
    nested, top = rope.float("rope_theta", None), cfg.float("rope_theta", None)
    if nested is not None and top is not None and nested != top:
        raise ConversionError(f"{cfg.where}: rope_theta {top} and rope_parameters.rope_theta "
                              f"{nested} disagree")
    return nested if nested is not None else top


def _rope_scaling(cfg: Config, rope: Config) -> RopeScaling:
    kind = rope.str("rope_type", None) or rope.str("type", None) or "default"
    if kind == "default":
        return RopeScaling("none")

    def orig_ctx() -> int:
        return rope.int("original_max_position_embeddings", None) or cfg.int(
            "original_max_position_embeddings")

    if kind == "linear":
        return RopeScaling("linear", factor=rope.float("factor"))
    if kind == "yarn":
        return RopeScaling(
            "yarn", factor=rope.float("factor"), original_context_length=orig_ctx(),
            yarn_ext_factor=rope.float("extrapolation_factor", None),
            yarn_attn_factor=rope.float("attention_factor", None) or rope.float("attn_factor", None),
            yarn_beta_fast=rope.float("beta_fast", None),
            yarn_beta_slow=rope.float("beta_slow", None))
    if kind == "llama3":
        return RopeScaling("llama3", factor=rope.float("factor"),
                           original_context_length=orig_ctx(),
                           low_freq_factor=rope.float("low_freq_factor"),
                           high_freq_factor=rope.float("high_freq_factor"))
    raise ConversionError(f"{rope.where}: rope type {kind!r} is not supported "
                          "(supported: default, linear, yarn, llama3 for Llama)")


def read_backbone(cfg: Config) -> Backbone:
    rope = _rope_dict(cfg)
    partial = rope.float("partial_rotary_factor", None) or cfg.float("partial_rotary_factor", None)
    bb = Backbone(
        n_layer=cfg.int("num_hidden_layers", minimum=1),
        n_ctx=cfg.int("max_position_embeddings", minimum=1),
        n_embd=cfg.int("hidden_size", minimum=1),
        n_ff=cfg.int("intermediate_size", minimum=1),
        n_head=cfg.int("num_attention_heads", minimum=1),
        n_head_kv=cfg.int("num_key_value_heads", None, minimum=1),
        explicit_head_dim=cfg.int("head_dim", None, minimum=1),
        rms_eps=cfg.float("rms_norm_eps"),
        rope_theta=_rope_theta(cfg, rope),
        rope=_rope_scaling(cfg, rope),
        partial_rotary_factor=partial,
        vocab_size=cfg.int("vocab_size", minimum=1),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", False),
        is_causal=cfg.bool("is_causal", None),
    )
    if bb.n_head % bb.kv_heads != 0:
        raise ConversionError(f"{cfg.where}: num_attention_heads {bb.n_head} is not a multiple "
                              f"of num_key_value_heads {bb.kv_heads}")
    if bb.explicit_head_dim is None and bb.n_embd % bb.n_head != 0:
        raise ConversionError(f"{cfg.where}: hidden_size is not a multiple of "
                              "num_attention_heads and no head_dim is given")
    return bb


def _write_rope_scaling(rope: RopeScaling, kv: KeyValues) -> None:
    if rope.kind not in ("linear", "yarn"):
        return  # "none" needs no keys; llama3 becomes a rope_freqs tensor
    kv.string(K.ROPE_SCALING_TYPE, rope.kind)
    kv.f32(K.ROPE_SCALING_FACTOR, rope.factor)
    if rope.kind == "yarn":
        kv.u32(K.ROPE_SCALING_ORIG_CTX, rope.original_context_length)
        optional = ((K.ROPE_YARN_EXT_FACTOR, rope.yarn_ext_factor),
                    (K.ROPE_YARN_ATTN_FACTOR, rope.yarn_attn_factor),
                    (K.ROPE_YARN_BETA_FAST, rope.yarn_beta_fast),
                    (K.ROPE_YARN_BETA_SLOW, rope.yarn_beta_slow))
        for key, value in optional:
            if value is not None:
                kv.f32(key, value)


def write_backbone_kv(bb: Backbone, kv: KeyValues) -> None:
    """The hyperparameter keys llama.cpp writes for every decoder of this family."""
    kv.u32(K.BLOCK_COUNT, bb.n_layer)
    kv.u32(K.CONTEXT_LENGTH, bb.n_ctx)
    kv.u32(K.EMBEDDING_LENGTH, bb.n_embd)
    kv.u32(K.FEED_FORWARD_LENGTH, bb.n_ff)
    kv.u32(K.HEAD_COUNT, bb.n_head)
    if bb.n_head_kv is not None:
        kv.u32(K.HEAD_COUNT_KV, bb.n_head_kv)
    _write_rope_scaling(bb.rope, kv)
    if bb.rope_theta is not None:
        kv.f32(K.ROPE_FREQ_BASE, bb.rope_theta)
    kv.f32(K.RMS_EPS, bb.rms_eps)
    if bb.explicit_head_dim is not None:
        kv.u32(K.KEY_LENGTH, bb.explicit_head_dim)
        kv.u32(K.VALUE_LENGTH, bb.explicit_head_dim)
