"""Llama (`LlamaForCausalLM`), written as llama.cpp's `llama` architecture.

What differs from the other dense decoders (`dense.py`): llama.cpp's `llama` ropes adjacent
pairs, so the q/k rows are permuted from Hugging Face's half-split layout; projection biases
come from the config (`attention_bias`, `mlp_bias`); Llama-3.1 rope scaling becomes per-pair
frequency divisors (`rope_freqs.weight`); the GGUF also states vocab_size and the rope
dimension count, and the tokenizer its add_space_prefix."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .. import gguf_keys as K
from ..backbone import Backbone
from ..hf_config import Config
from ..metadata import KeyValues
from ..plan import HeadPermutedTensor
from ..safetensors_io import TensorRef
from ..tensor_names import layer_tensor_shapes
from .dense import DenseDecoder


def llama3_rope_factors(bb: Backbone) -> np.ndarray:
    """Per-frequency divisors of Llama-3.1 rope scaling (the `rope_freqs.weight` tensor).

    Computed in float32 like llama.cpp's converter so the values match bit for bit."""
    f32 = np.float32
    rope = bb.rope
    dim = bb.head_dim
    base = bb.rope_theta if bb.rope_theta is not None else 10000.0
    freqs = f32(1.0) / (f32(base) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    low_wavelen = rope.original_context_length / rope.low_freq_factor
    high_wavelen = rope.original_context_length / rope.high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < f32(high_wavelen):
            factors.append(f32(1.0))
        elif wavelen > f32(low_wavelen):
            factors.append(f32(rope.factor))
        else:
            smooth = ((f32(rope.original_context_length) / wavelen - f32(rope.low_freq_factor))
                      / f32(rope.high_freq_factor - rope.low_freq_factor))
            factors.append(f32(1.0) / ((f32(1.0) - smooth) / f32(rope.factor) + smooth))
    return np.array(factors, dtype=np.float32)


class Llama(DenseDecoder):
    gguf_arch = "llama"
    hf_architectures = ("LlamaForCausalLM",)
    add_space_prefix_key = True

    def check_rope(self, cfg: Config, bb: Backbone) -> None:
        pass  # every rope scaling converts, llama3's as rope_freqs

    def layer_shapes(self, cfg: Config, bb: Backbone) -> dict[str, tuple[int, ...]]:
        attention_bias = cfg.bool("attention_bias", False)
        return layer_tensor_shapes(bb, qk_norm=False, qkv_bias=attention_bias,
                                   o_bias=attention_bias, mlp_bias=cfg.bool("mlp_bias", False))

    def source(self, ref: TensorRef, part: Optional[str], bb: Backbone):
        if part in ("self_attn.q_proj.weight", "self_attn.q_proj.bias"):
            return HeadPermutedTensor(ref, bb.n_head)
        if part in ("self_attn.k_proj.weight", "self_attn.k_proj.bias"):
            return HeadPermutedTensor(ref, bb.kv_heads)
        return super().source(ref, part, bb)

    def extra_kv(self, bb: Backbone, kv: KeyValues) -> None:
        kv.u32(K.VOCAB_SIZE, bb.vocab_size)
        kv.u32(K.ROPE_DIMENSION_COUNT, bb.head_dim)

    def rope_freqs(self, bb: Backbone) -> Optional[np.ndarray]:
        return llama3_rope_factors(bb) if bb.rope.kind == "llama3" else None


ARCH = Llama()
