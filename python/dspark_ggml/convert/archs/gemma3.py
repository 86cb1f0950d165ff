"""Gemma-3 (`Gemma3ForCausalLM`, and the text model of `Gemma3ForConditionalGeneration`), written as
llama.cpp's `gemma3` architecture.

Gemma-3 interleaves sliding-window and global layers (`layer_types`, written as the bool array
`attention.sliding_window_pattern`), each kind with its own rope base; every layer has the same
head size and KV heads, q/k norms and sandwich norms. Its RMSNorm multiplies by 1 + weight, so the
norms are written with the 1 added, as llama.cpp's converter does. The query scale
(`query_pre_attn_scalar`) has no GGUF key: llama.cpp takes 1/sqrt(head_dim), or 1/sqrt(hidden /
heads) for the 62-layer 27B model, so a config that says otherwise is refused.

The tokenizer keys are Gemma-4's (`gemma4.py`): the same SentencePiece-style BPE in tokenizer.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from gguf import GGUFValueType

from .. import gguf_keys as K
from ..errors import ConversionError
from ..hf_config import Config
from ..metadata import KeyValues
from ..options import Overrides
from ..plan import ModelPlan, PlannedTensor, ShiftedTensor, StoredTensor
from ..quant import OutType, tensor_type
from ..safetensors_io import FLOAT_DTYPES, Checkpoint, TensorRef
from .base import TargetArch, TargetDims
from .gemma4 import (ACTIVATION, FULL, SANDWICH_LAYER_NAMES, SLIDING, check_tied_head, text_config,
                     write_gemma4_tokenizer_kv)

GGUF_ARCH = "gemma3"
CONDITIONAL = "Gemma3ForConditionalGeneration"
TEXT_PREFIX = {"Gemma3ForCausalLM": "model.", CONDITIONAL: "model.language_model."}
_MULTIMODAL = ("model.vision_tower.", "model.multi_modal_projector.")
N_LAYER_27B = 62  # llama.cpp's rule for the query scale


@dataclass(frozen=True)
class Gemma3Text:
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    sliding: tuple[bool, ...]  # per layer
    window: Optional[int]
    rope_theta_full: float
    rope_theta_swa: float
    linear_factor: Optional[float]  # the global layers' linear rope scaling
    rms_eps: float
    final_softcap: Optional[float]
    vocab_size: int
    tie_word_embeddings: bool


def _layer_types(cfg: Config, n_layer: int) -> list[str]:
    types = cfg.str_list("layer_types", None)
    if types is None:  # older configs: a period whose last layer is global
        period = cfg.int("sliding_window_pattern", 6, minimum=1)
        types = [FULL if (i + 1) % period == 0 else SLIDING for i in range(n_layer)]
    if len(types) != n_layer or not set(types) <= {FULL, SLIDING}:
        raise ConversionError(f"{cfg.where}: field 'layer_types' should list '{FULL}' or "
                              f"'{SLIDING}' for each of the {n_layer} layers")
    return types


def _rope(cfg: Config) -> tuple[float, float, Optional[float]]:
    """(global theta, sliding theta, linear factor of the global layers or None)."""
    rope = cfg.sub("rope_parameters")
    full = rope.sub(FULL) if rope is not None else None
    sliding = rope.sub(SLIDING) if rope is not None else None
    theta_full = full.float("rope_theta", 1e6) if full else cfg.float("rope_theta", 1e6)
    theta_swa = sliding.float("rope_theta", 1e4) if sliding else cfg.float("rope_local_base_freq", 1e4)
    scaling = full if full is not None else cfg.sub("rope_scaling")
    kind = scaling.str("rope_type", "default") if scaling is not None else "default"
    if kind not in ("default", "linear"):
        raise ConversionError(f"{cfg.where}: rope_type {kind!r} of the global layers is not supported "
                              "(default or linear)")
    if sliding is not None and sliding.str("rope_type", "default") != "default":
        raise ConversionError(f"{sliding.where}: field 'rope_type' should be 'default' for the "
                              "sliding layers")
    factor = scaling.float("factor", minimum=1.0) if kind == "linear" else None
    return theta_full, theta_swa, factor


def _refuse_unsupported(cfg: Config, g: Gemma3Text) -> None:
    if cfg.str("hidden_activation", ACTIVATION) != ACTIVATION:
        raise ConversionError(f"{cfg.where}: field 'hidden_activation' should be {ACTIVATION!r}")
    if cfg.bool("attention_bias", False):
        raise ConversionError(f"{cfg.where}: field 'attention_bias': projection biases are not "
                              "supported for Gemma-3")
    if cfg.float("attn_logit_softcapping", None) is not None:
        raise ConversionError(f"{cfg.where}: field 'attn_logit_softcapping' is not supported "
                              "(llama.cpp's gemma3 has no attention soft-capping)")
    if cfg.bool("use_bidirectional_attention", False):
        raise ConversionError(f"{cfg.where}: field 'use_bidirectional_attention' (an embedding "
                              "model) is not supported")
    implied = g.n_embd // g.n_head if g.n_layer == N_LAYER_27B else g.head_dim
    scalar = cfg.float("query_pre_attn_scalar", implied)
    if scalar != implied:
        raise ConversionError(f"{cfg.where}: field 'query_pre_attn_scalar' {scalar:g} differs from "
                              f"the {implied} llama.cpp assumes for a {g.n_layer}-layer Gemma-3 "
                              "(the GGUF has no key for it)")
    if g.n_head % g.n_head_kv:
        raise ConversionError(f"{cfg.where}: num_attention_heads {g.n_head} is not a multiple of "
                              f"num_key_value_heads {g.n_head_kv}")


def read_gemma3(cfg: Config) -> Gemma3Text:
    """Hyperparameters of a `gemma3_text` config (for the conditional model: its text_config)."""
    n_layer = cfg.int("num_hidden_layers", minimum=1)
    types = _layer_types(cfg, n_layer)
    theta_full, theta_swa, factor = _rope(cfg)
    g = Gemma3Text(
        n_layer=n_layer, n_ctx=cfg.int("max_position_embeddings", minimum=1),
        n_embd=cfg.int("hidden_size", minimum=1), n_ff=cfg.int("intermediate_size", minimum=1),
        n_head=cfg.int("num_attention_heads", minimum=1),
        n_head_kv=cfg.int("num_key_value_heads", minimum=1), head_dim=cfg.int("head_dim", minimum=2),
        sliding=tuple(t == SLIDING for t in types), window=cfg.int("sliding_window", None, minimum=1),
        rope_theta_full=theta_full, rope_theta_swa=theta_swa, linear_factor=factor,
        rms_eps=cfg.float("rms_norm_eps"), final_softcap=cfg.float("final_logit_softcapping", None) or None,
        vocab_size=cfg.int("vocab_size", minimum=1),
        tie_word_embeddings=cfg.bool("tie_word_embeddings", True),
    )
    if any(g.sliding) and g.window is None:
        raise ConversionError(f"{cfg.where}: sliding-window layers but no field 'sliding_window'")
    _refuse_unsupported(cfg, g)
    return g


def write_gemma3_kv(g: Gemma3Text, kv: KeyValues) -> None:
    """The hyperparameter keys of the `gemma3` architecture, as llama.cpp's converter writes them
    (the layer kinds as a bool array, which llama.cpp reads before its period default)."""
    kv.u32(K.BLOCK_COUNT, g.n_layer)
    kv.u32(K.CONTEXT_LENGTH, g.n_ctx)
    kv.u32(K.EMBEDDING_LENGTH, g.n_embd)
    kv.u32(K.FEED_FORWARD_LENGTH, g.n_ff)
    kv.u32(K.HEAD_COUNT, g.n_head)
    kv.u32(K.HEAD_COUNT_KV, g.n_head_kv)
    kv.u32(K.KEY_LENGTH, g.head_dim)
    kv.u32(K.VALUE_LENGTH, g.head_dim)
    kv.f32(K.RMS_EPS, g.rms_eps)
    kv.f32(K.ROPE_FREQ_BASE, g.rope_theta_full)
    kv.f32(K.ROPE_FREQ_BASE_SWA, g.rope_theta_swa)
    if g.linear_factor is not None:
        kv.string(K.ROPE_SCALING_TYPE, "linear")
        kv.f32(K.ROPE_SCALING_FACTOR, g.linear_factor)
    if g.window is not None and any(g.sliding):
        kv.u32(K.SLIDING_WINDOW, g.window)
        kv.array(K.SLIDING_WINDOW_PATTERN, list(g.sliding), GGUFValueType.BOOL)
    if g.final_softcap is not None:
        kv.f32(K.FINAL_LOGIT_SOFTCAPPING, g.final_softcap)


def _table(g: Gemma3Text) -> dict[str, tuple[str, tuple[int, ...], bool]]:
    """HF name (without the model prefix) -> (GGUF name, shape, required): Gemma-4's sandwich-norm
    layer names (gemma4.SANDWICH_LAYER_NAMES), the norms written with Gemma's + 1 (_planned)."""
    e, d, f = g.n_embd, g.head_dim, g.n_ff
    q, kv = g.n_head * d, g.n_head_kv * d
    shapes = {"input_layernorm.weight": (e,), "post_attention_layernorm.weight": (e,),
              "pre_feedforward_layernorm.weight": (e,), "post_feedforward_layernorm.weight": (e,),
              "self_attn.q_proj.weight": (q, e), "self_attn.k_proj.weight": (kv, e),
              "self_attn.v_proj.weight": (kv, e), "self_attn.o_proj.weight": (e, q),
              "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
              "mlp.gate_proj.weight": (f, e), "mlp.up_proj.weight": (f, e), "mlp.down_proj.weight": (e, f)}
    table = {"embed_tokens.weight": ("token_embd.weight", (g.vocab_size, e), True),
             "norm.weight": ("output_norm.weight", (e,), True),
             "lm_head.weight": ("output.weight", (g.vocab_size, e), not g.tie_word_embeddings)}
    for i in range(g.n_layer):
        for part, shape in shapes.items():
            table[f"layers.{i}.{part}"] = (f"blk.{i}.{SANDWICH_LAYER_NAMES[part]}", shape, True)
    return table


def _planned(ref: TensorRef, gguf_name: str, out: OutType) -> PlannedTensor:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
    source = ShiftedTensor(ref, 1.0) if gguf_name.endswith("norm.weight") else StoredTensor(ref)
    return PlannedTensor(gguf_name, source, tensor_type(gguf_name, ref.shape, out))


def plan_gemma3_target(ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, Gemma3Text]:
    text = text_config(cfg, CONDITIONAL)
    g = read_gemma3(text)
    kv = KeyValues(GGUF_ARCH)
    write_gemma3_kv(g, kv)
    plan = ModelPlan(GGUF_ARCH, kv)
    prefix = TEXT_PREFIX[cfg.architecture()]
    table = _table(g)
    seen, left_out = set(), 0
    for name, ref in ckpt.items():
        if name.startswith(_MULTIMODAL):
            left_out += 1
            continue
        key = name if name == "lm_head.weight" else name[len(prefix):] if name.startswith(prefix) else None
        expected = table.get(key) if key is not None else None
        if expected is None:
            raise ConversionError(f"{ref.describe()}: unexpected tensor for the Gemma-3 config "
                                  f"{text.where} (no GGUF name)")
        if ref.shape != expected[1]:
            raise ConversionError(f"{ref.describe()}: expected shape {list(expected[1])} from {text.where}")
        plan.add(_planned(ref, expected[0], out))
        seen.add(key)
    missing = [prefix + k for k, e in table.items() if e[2] and k not in seen]
    if missing:
        raise ConversionError(f"{text.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")
    check_tied_head(ckpt, g.tie_word_embeddings, prefix, text.where)
    if left_out:
        plan.notes.append(f"{left_out} vision tensor(s) left out (text model only)")
    return plan, g


class Gemma3(TargetArch):
    gguf_arch = GGUF_ARCH
    hf_architectures = tuple(TEXT_PREFIX)

    def plan_target(self, ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, int]:
        plan, g = plan_gemma3_target(ckpt, cfg, out)
        return plan, g.vocab_size

    def target_dims(self, cfg: Config) -> TargetDims:
        g = read_gemma3(text_config(cfg, CONDITIONAL))
        return TargetDims(g.n_layer, g.n_embd, g.vocab_size, TEXT_PREFIX[cfg.architecture()])

    def tokenizer_kv(self, tokenizer_dir: Path, vocab_size: int, kv: KeyValues, ov: Overrides) -> None:
        write_gemma4_tokenizer_kv(tokenizer_dir, vocab_size, kv)


ARCH = Gemma3()
