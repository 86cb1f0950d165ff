"""Target models: Qwen3, Qwen2 and Llama decoders, written as llama.cpp's `qwen3`, `qwen2` and
`llama` architectures (same keys, tensor names, layouts and types as llama.cpp's converter).
Qwen3-MoE (`moe.py`) and Gemma-4 (`gemma4_target.py`) have planners of their own; `plan_target`
dispatches on the family's kind."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType

from . import gguf_keys as K
from .backbone import Backbone, read_backbone, write_backbone_kv
from .errors import ConversionError
from .gemma4_target import TEXT_PREFIX, plan_gemma4_target
from .hf_config import Config
from .metadata import KeyValues
from .moe import plan_qwen3moe_target
from .plan import ArrayTensor, HeadPermutedTensor, ModelPlan, PlannedTensor, StoredTensor
from .quant import OutType, tensor_type
from .safetensors_io import Checkpoint, TensorRef, tensors_equal
from .tensor_names import ROPE_FREQS, layer_tensor_name, layer_tensor_shapes


@dataclass(frozen=True)
class TargetFamily:
    gguf_arch: str
    qk_norm: bool  # per-head q/k RMSNorm (Qwen3)
    qkv_bias: bool  # q/k/v projection biases always present (Qwen2)
    llama_layout: bool  # q/k rows permuted for llama.cpp's rope, biases from config, extra keys
    kind: str = "dense"  # "dense" (this file), "moe" (moe.py) or "gemma4" (gemma4_target.py)


FAMILIES = {
    "Qwen3ForCausalLM": TargetFamily("qwen3", qk_norm=True, qkv_bias=False, llama_layout=False),
    "Qwen2ForCausalLM": TargetFamily("qwen2", qk_norm=False, qkv_bias=True, llama_layout=False),
    "LlamaForCausalLM": TargetFamily("llama", qk_norm=False, qkv_bias=False, llama_layout=True),
    "Qwen3MoeForCausalLM": TargetFamily("qwen3moe", qk_norm=True, qkv_bias=False,
                                        llama_layout=False, kind="moe"),
    **{arch: TargetFamily("gemma4", qk_norm=True, qkv_bias=False, llama_layout=False,
                          kind="gemma4") for arch in TEXT_PREFIX},
}

# HF name -> GGUF name of the tensors outside the decoder layers
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def target_family(cfg: Config) -> Optional[TargetFamily]:
    return FAMILIES.get(cfg.architecture())


# ----------------------------------------------------------------------------------------------
# validation of what the GGUF architectures cannot express


def _check_supported(cfg: Config, family: TargetFamily, bb: Backbone) -> None:
    layer_types = cfg.str_list("layer_types", [])
    if cfg.bool("use_sliding_window", False) or "sliding_attention" in layer_types:
        raise ConversionError(f"{cfg.where}: sliding-window attention is not supported for "
                              f"{family.gguf_arch} targets (llama.cpp would run it as full attention)")
    if bb.rope.kind == "llama3" and not family.llama_layout:
        raise ConversionError(f"{cfg.where}: llama3 rope scaling on a {family.gguf_arch} model "
                              "cannot be expressed in GGUF")
    if bb.partial_rotary_factor not in (None, 1.0):
        raise ConversionError(f"{cfg.where}: partial_rotary_factor {bb.partial_rotary_factor} is "
                              f"not supported for {family.gguf_arch} targets")
    for key in ("num_experts", "num_local_experts"):
        if cfg.int(key, 0):
            raise ConversionError(f"{cfg.where}: mixture-of-experts models are not supported")


def _layer_shapes(cfg: Config, family: TargetFamily, bb: Backbone) -> dict[str, tuple[int, ...]]:
    if family.llama_layout:
        attention_bias = cfg.bool("attention_bias", False)
        return layer_tensor_shapes(bb, qk_norm=False, qkv_bias=attention_bias,
                                   o_bias=attention_bias, mlp_bias=cfg.bool("mlp_bias", False))
    return layer_tensor_shapes(bb, qk_norm=family.qk_norm, qkv_bias=family.qkv_bias)


# ----------------------------------------------------------------------------------------------
# tensors


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


def _gguf_name(hf_name: str, bb: Backbone) -> tuple[str, Optional[str]]:
    """(GGUF name, key into the per-layer shape table or None for a global tensor)."""
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name], None
    layer = layer_tensor_name(hf_name.removeprefix("model.")) if hf_name.startswith("model.") \
        else None
    if layer is None or layer[0] >= bb.n_layer:
        raise ConversionError(f"unexpected tensor {hf_name!r} in the checkpoint (no GGUF name)")
    return layer[2], layer[1]


def _source(ref: TensorRef, part: Optional[str], family: TargetFamily, bb: Backbone):
    if family.llama_layout and part in ("self_attn.q_proj.weight", "self_attn.q_proj.bias"):
        return HeadPermutedTensor(ref, bb.n_head)
    if family.llama_layout and part in ("self_attn.k_proj.weight", "self_attn.k_proj.bias"):
        return HeadPermutedTensor(ref, bb.kv_heads)
    return StoredTensor(ref)


def _plan_tensors(plan: ModelPlan, ckpt: Checkpoint, cfg: Config, family: TargetFamily,
                  bb: Backbone, out: OutType) -> None:
    layer_shapes = _layer_shapes(cfg, family, bb)
    global_shapes = {"token_embd.weight": (bb.vocab_size, bb.n_embd),
                     "output_norm.weight": (bb.n_embd,),
                     "output.weight": (bb.vocab_size, bb.n_embd)}
    if bb.rope.kind == "llama3":
        plan.add(PlannedTensor(ROPE_FREQS, ArrayTensor(llama3_rope_factors(bb)),
                               GGMLQuantizationType.F32))
    for hf_name, ref in ckpt.items():
        if hf_name.endswith(".rotary_emb.inv_freq"):
            continue  # recomputed by the runtime
        name, part = _gguf_name(hf_name, bb)
        expected = global_shapes[name] if part is None else layer_shapes.get(part)
        if expected is None or ref.shape != expected:
            raise ConversionError(f"{ref.describe()}: expected shape "
                                  f"{list(expected) if expected else 'none (unexpected tensor)'} "
                                  f"from {cfg.where}")
        if ref.dtype not in ("F32", "F16", "BF16", "F64"):
            raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
        plan.add(PlannedTensor(name, _source(ref, part, family, bb),
                               tensor_type(name, ref.shape, out)))
    _check_complete(plan, cfg, bb, layer_shapes)
    _check_tied_head(ckpt, cfg, bb)


def _check_complete(plan: ModelPlan, cfg: Config, bb: Backbone,
                    layer_shapes: dict[str, tuple[int, ...]]) -> None:
    have = {t.name for t in plan.tensors}
    required = {"token_embd.weight", "output_norm.weight"}
    for i in range(bb.n_layer):
        for part in layer_shapes:
            required.add(layer_tensor_name(f"layers.{i}.{part}")[2])
    missing = sorted(required - have)
    if missing:
        raise ConversionError(f"{cfg.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")
    if "output.weight" not in have and not bb.tie_word_embeddings:
        raise ConversionError(f"{cfg.where}: tie_word_embeddings is false but the checkpoint has "
                              "no lm_head.weight")


def _check_tied_head(ckpt: Checkpoint, cfg: Config, bb: Backbone) -> None:
    """A tied model that still stores an lm_head: Hugging Face uses the embedding, llama.cpp
    would use the stored head. Harmless when they are equal; refused when they are not."""
    head = ckpt.get("lm_head.weight")
    if bb.tie_word_embeddings and head is not None and not tensors_equal(
            head, ckpt["model.embed_tokens.weight"]):
        raise ConversionError(f"{cfg.where}: tie_word_embeddings is true but lm_head.weight "
                              "differs from the embedding; fix tie_word_embeddings in the config")


# ----------------------------------------------------------------------------------------------


def plan_target(ckpt: Checkpoint, cfg: Config, family: TargetFamily,
                out: OutType) -> tuple[ModelPlan, int]:
    """Hyperparameter keys and tensors of a target model (tokenizer keys are added by the caller),
    and its vocabulary size."""
    if family.kind == "gemma4":
        plan, g = plan_gemma4_target(ckpt, cfg, out)
        return plan, g.vocab_size
    if family.kind == "moe":
        plan, bb = plan_qwen3moe_target(ckpt, cfg, out)
        return plan, bb.vocab_size
    bb = read_backbone(cfg)
    _check_supported(cfg, family, bb)
    kv = KeyValues(family.gguf_arch)
    write_backbone_kv(bb, kv)
    if family.llama_layout:
        kv.u32(K.VOCAB_SIZE, bb.vocab_size)
        kv.u32(K.ROPE_DIMENSION_COUNT, bb.head_dim)
    plan = ModelPlan(family.gguf_arch, kv)
    _plan_tensors(plan, ckpt, cfg, family, bb, out)
    return plan, bb.vocab_size
