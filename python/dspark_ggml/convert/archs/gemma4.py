"""Gemma-4 (`Gemma4ForCausalLM`, and the text model of `Gemma4ForConditionalGeneration`), written
as llama.cpp's `gemma4` architecture; Gemma-4 layers are also the layers of Gemma-4 DSpark drafts
(`model_type` gemma4_text).

Gemma-4 interleaves sliding-window and full ("global") attention layers that differ in head size
and KV heads, rotates only part of the global heads ("proportional" rope), may share the KV of
the last layers with earlier ones, and optionally adds per-layer inputs (PLE) and a routed
expert block next to the dense MLP. `Gemma4Text` holds all of it, read from either config style
transformers has written: `global_head_dim` / `num_global_key_value_heads`, or the
`per_layer_config` overrides that transformers 5.2x serialises instead.

Sections, in order: the hyperparameters and the keys they become; the tensors (Hugging Face
names -> GGUF names and the shapes a config implies); the target plan; the tokenizer keys; the
draft layers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, TokenType

from .. import gguf_keys as K
from ..backbone import Backbone, RopeScaling
from ..errors import ConversionError
from ..hf_config import Config, agreed
from ..metadata import KeyValues
from ..options import Overrides
from ..plan import ArrayTensor, ModelPlan, PlannedTensor, StoredTensor
from ..quant import OutType, tensor_type
from ..safetensors_io import FLOAT_DTYPES, Checkpoint, TensorRef, tensors_equal
from ..tensor_names import ROPE_FREQS
from ..tokenizer_meta import SPECIAL_ROLES, load_sources, merges_of, special_tokens, \
    write_special_vocab_kv
from .base import DraftBackbone, DraftLayers, TargetArch, TargetDims

GGUF_ARCH = "gemma4"

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


# ----------------------------------------------------------------------------------------------
# tensors
#
# Names follow llama.cpp's `gemma4` architecture. Unlike Gemma 2/3, Gemma-4's RMSNorm multiplies
# by the stored weight itself, so norms are written as stored (no +1). The routed experts stay in
# their fused 3-D form: `experts.gate_up_proj` [experts, 2 x expert width, hidden] becomes
# `ffn_gate_up_exps.weight` unsplit (the runtime splits the halves), the router's scales become
# `ffn_gate_inp.scale` and, per expert, `ffn_down_exps.scale`. Shapes are in PyTorch order
# ([out, in] for linear weights, [experts, out, in] for experts).


# inside `layers.{i}.` -> inside `blk.{i}.`: the sandwich-norm layer Gemma-3 has too, then Gemma-4's own
SANDWICH_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_NAMES = {
    **SANDWICH_LAYER_NAMES,
    "layer_scalar": "layer_output_scale.weight",
    # per-layer inputs
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    # routed experts, next to the dense MLP
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}

_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


@dataclass(frozen=True)
class Expected:
    gguf_name: str
    shape: tuple[int, ...]
    required: bool = True


def _layer(g: Gemma4Text, i: int) -> dict[str, tuple[int, ...]]:
    e, d, q = g.n_embd, g.head_dim(i), g.n_head * g.head_dim(i)
    kv, f = g.kv_heads(i) * d, g.n_ff_of(i)
    shapes = {
        "input_layernorm.weight": (e,), "post_attention_layernorm.weight": (e,),
        "pre_feedforward_layernorm.weight": (e,), "post_feedforward_layernorm.weight": (e,),
        "layer_scalar": (1,),
        "self_attn.q_proj.weight": (q, e), "self_attn.q_norm.weight": (d,),
        "self_attn.o_proj.weight": (e, q),
        "mlp.gate_proj.weight": (f, e), "mlp.up_proj.weight": (f, e), "mlp.down_proj.weight": (e, f),
    }
    if g.owns_kv(i):
        shapes.update({"self_attn.k_proj.weight": (kv, e), "self_attn.k_norm.weight": (d,)})
    if g.has_v_proj(i):
        shapes["self_attn.v_proj.weight"] = (kv, e)
    if g.n_embd_per_layer:
        p = g.n_embd_per_layer
        shapes.update({"per_layer_input_gate.weight": (p, e), "per_layer_projection.weight": (e, p),
                       "post_per_layer_input_norm.weight": (e,)})
    if g.experts is not None:
        x, fe = g.experts.count, g.experts.n_ff
        shapes.update({
            "router.proj.weight": (x, e), "router.scale": (e,), "router.per_expert_scale": (x,),
            "experts.gate_up_proj": (x, 2 * fe, e), "experts.down_proj": (x, e, fe),
            "pre_feedforward_layernorm_2.weight": (e,),
            "post_feedforward_layernorm_1.weight": (e,),
            "post_feedforward_layernorm_2.weight": (e,),
        })
    return shapes


def _stale_kv(g: Gemma4Text, i: int) -> dict[str, tuple[int, ...]]:
    """K/V tensors some checkpoints still store for a KV-sharing layer (transformers ignores
    them; llama.cpp's converter writes them): accepted, not required."""
    if g.owns_kv(i):
        return {}
    d, kv, e = g.head_dim(i), g.kv_heads(i) * g.head_dim(i), g.n_embd
    stale = {"self_attn.k_proj.weight": (kv, e), "self_attn.k_norm.weight": (d,)}
    if not (g.k_eq_v and not g.sliding[i]):
        stale["self_attn.v_proj.weight"] = (kv, e)
    return stale


def gguf_layer_name(layer: int, part: str) -> str:
    """GGUF name of one Gemma-4 layer tensor: (3, "layer_scalar") -> "blk.3.layer_output_scale.weight"."""
    return f"blk.{layer}.{_LAYER_NAMES[part]}"


def layer_table(g: Gemma4Text, prefix: str = "layers.") -> dict[str, Expected]:
    """Every decoder-layer tensor of a Gemma-4 stack, by HF name (from `layers.`)."""
    table = {}
    for i in range(g.n_layer):
        for part, shape in _layer(g, i).items():
            table[f"{prefix}{i}.{part}"] = Expected(gguf_layer_name(i, part), shape)
        for part, shape in _stale_kv(g, i).items():
            table[f"{prefix}{i}.{part}"] = Expected(gguf_layer_name(i, part), shape, False)
    return table


def target_table(g: Gemma4Text) -> dict[str, Expected]:
    """Every tensor of a Gemma-4 language model, by HF name without the model prefix
    (`lm_head.weight` is listed under that name)."""
    e = g.n_embd
    table = {"embed_tokens.weight": Expected("token_embd.weight", (g.vocab_size, e)),
             "norm.weight": Expected("output_norm.weight", (e,)),
             "lm_head.weight": Expected("output.weight", (g.vocab_size, e),
                                        required=not g.tie_word_embeddings)}
    if g.n_embd_per_layer:
        width = g.n_layer * g.n_embd_per_layer
        for name, shape in (("embed_tokens_per_layer.weight", (g.vocab_size_per_layer, width)),
                            ("per_layer_model_projection.weight", (width, e)),
                            ("per_layer_projection_norm.weight", (g.n_embd_per_layer,))):
            table[name] = Expected(_GLOBAL_NAMES[name], shape)
    table.update(layer_table(g))
    return table


# ----------------------------------------------------------------------------------------------
# targets
#
# The conditional model keeps its language model under `model.language_model.` and its text
# hyperparameters in `text_config` (read over the top-level fields, as llama.cpp does); its vision
# and audio towers and their embedders are not part of a text GGUF and are left out. A tied model
# has no `output.weight` (the runtime uses the embedding).


CONDITIONAL = "Gemma4ForConditionalGeneration"
# where the language model's tensors live, by architecture
TEXT_PREFIX = {"Gemma4ForCausalLM": "model.", CONDITIONAL: "model.language_model."}
_MULTIMODAL = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
               "model.embed_audio.")


def text_config(cfg: Config, conditional: str = CONDITIONAL) -> Config:
    """The text hyperparameters: the config itself, or the conditional model's text_config
    read over its top-level fields (Gemma-3's conditional model keeps them the same way)."""
    if cfg.architecture() != conditional:
        return cfg
    text = cfg.sub("text_config")
    if text is None:
        raise ConversionError(f"{cfg.where}: {conditional} config without text_config")
    return Config({**cfg.data, **text.data}, text.where)


def _hf_key(name: str, prefix: str) -> str | None:
    """Checkpoint name -> key of the tensor table (None: not a language-model tensor)."""
    if name == "lm_head.weight":
        return name
    return name[len(prefix):] if name.startswith(prefix) else None


def check_tied_head(ckpt: Checkpoint, tied: bool, prefix: str, where: str) -> None:
    """A tied model that still stores an lm_head must store the embedding there."""
    head = ckpt.get("lm_head.weight")
    if tied and head is not None and not tensors_equal(
            head, ckpt[prefix + "embed_tokens.weight"]):
        raise ConversionError(f"{where}: tie_word_embeddings is true but lm_head.weight differs "
                              "from the embedding; fix tie_word_embeddings in the config")


def _planned(ref: TensorRef, gguf_name: str, out: OutType) -> PlannedTensor:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
    return PlannedTensor(gguf_name, StoredTensor(ref), tensor_type(gguf_name, ref.shape, out))


def plan_gemma4_target(ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, Gemma4Text]:
    text = text_config(cfg)
    g = read_gemma4(text)
    kv = KeyValues(GGUF_ARCH)
    write_gemma4_kv(g, kv)
    plan = ModelPlan(GGUF_ARCH, kv)
    freqs = rope_freqs(g)
    if freqs is not None:
        plan.add(PlannedTensor(ROPE_FREQS, ArrayTensor(freqs), GGMLQuantizationType.F32))

    prefix = TEXT_PREFIX[cfg.architecture()]
    table = target_table(g)
    seen, left_out = set(), 0
    for name, ref in ckpt.items():
        if name.startswith(_MULTIMODAL):
            left_out += 1
            continue
        key = _hf_key(name, prefix)
        expected = table.get(key) if key is not None else None
        if expected is None:
            raise ConversionError(f"{ref.describe()}: unexpected tensor for the Gemma-4 config "
                                  f"{text.where} (no GGUF name)")
        if ref.shape != expected.shape:
            raise ConversionError(f"{ref.describe()}: expected shape {list(expected.shape)} from "
                                  f"{text.where}")
        plan.add(_planned(ref, expected.gguf_name, out))
        seen.add(key)
    missing = [prefix + k for k, e in table.items() if e.required and k not in seen]
    if missing:
        raise ConversionError(f"{text.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")
    check_tied_head(ckpt, g.tie_word_embeddings, prefix, text.where)
    if left_out:
        plan.notes.append(f"{left_out} vision/audio tensor(s) left out (text model only)")
    return plan, g


# ----------------------------------------------------------------------------------------------
# tokenizer
#
# `tokenizer.ggml.model = "gemma4"`. Gemma's tokenizer.json is a SentencePiece-style BPE (byte
# fallback, spaces as U+2581). The keys are those llama.cpp's converter writes for it (through
# gguf's LlamaHfVocab), read here from the JSON files directly:
# * tokens: the model vocabulary by id, then the added tokens past it; every score is -1000;
# * types: `<0xXX>` byte tokens BYTE, the tokens tokenizer_config.json names as special (roles
#   and `extra_special_tokens`) CONTROL, other added tokens past the vocabulary USER_DEFINED, the
#   rest NORMAL; the chat-syntax tokens below are USER_DEFINED so that they stay visible in text;
# * merges, special ids, add flags and chat template as for every tokenizer; BOS is always added
#   and no space prefix is.


TOKENIZER_MODEL = "gemma4"
SCORE = -1000.0  # LlamaHfVocab has no scores for BPE pieces
# rendered as text by the chat parser, so never treated as control tokens
VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                            "<|tool_response>", "<tool_response|>", '<|"|>'})
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _check_model(tokenizer: dict, where: Path) -> None:
    model = tokenizer.get("model") or {}
    decoder = tokenizer.get("decoder") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback") \
            or decoder.get("type") != "Sequence":
        raise ConversionError(f"{where}: a Gemma-4 tokenizer should be a byte-fallback BPE with a "
                              "Sequence decoder (SentencePiece-style)")


def _named_specials(tokenizer_config: dict) -> set[str]:
    """Texts of the tokens transformers treats as special: the named roles and the extras."""
    def text(entry):
        return entry.get("content") if isinstance(entry, dict) else entry

    names = {text(tokenizer_config.get(f"{role}_token")) for role in SPECIAL_ROLES}
    extra = tokenizer_config.get("extra_special_tokens",
                                 tokenizer_config.get("additional_special_tokens")) or []
    names |= {text(t) for t in (extra.values() if isinstance(extra, dict) else extra)}
    return {n for n in names if isinstance(n, str)}


def _tokens(tokenizer: dict, specials: set[str], where: Path) -> tuple[list[str], list[int]]:
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    base = len(vocab)
    if sorted(vocab.values()) != list(range(base)):
        raise ConversionError(f"{where}: the vocabulary ids are not 0..{base - 1}")
    by_id = {i: t for t, i in vocab.items()}
    added = sorted((a for a in tokenizer.get("added_tokens", []) if a["id"] >= base),
                   key=lambda a: a["id"])
    if [a["id"] for a in added] != list(range(base, base + len(added))):
        raise ConversionError(f"{where}: the added tokens past the vocabulary leave gaps in the ids")
    ids_of = {**vocab, **{a["content"]: a["id"] for a in added}}
    special_ids = {ids_of[t] for t in specials if t in ids_of}
    tokens, types = [], []
    for i in range(base):
        text = by_id[i]
        if _BYTE_TOKEN.fullmatch(text):
            kind = TokenType.BYTE
        else:
            kind = TokenType.CONTROL if i in special_ids else TokenType.NORMAL
        tokens.append(text)
        types.append(kind)
    for a in added:
        tokens.append(a["content"])
        types.append(TokenType.CONTROL if a["content"] in specials else TokenType.USER_DEFINED)
    types = [TokenType.USER_DEFINED if t in VISIBLE_TOKENS else kind
             for t, kind in zip(tokens, types)]
    return tokens, [int(t) for t in types]


def write_gemma4_tokenizer_kv(model_dir: Path, vocab_size: int, kv: KeyValues) -> dict[str, int]:
    """Add the tokenizer keys of a Gemma-4 model directory; returns the special token ids."""
    src = load_sources(Path(model_dir))
    where = src.model_dir / "tokenizer.json"
    _check_model(src.tokenizer, where)
    tokens, types = _tokens(src.tokenizer, _named_specials(src.tokenizer_config or {}), where)
    if len(tokens) != vocab_size:
        # llama.cpp would write a token list and an embedding of different lengths
        raise ConversionError(f"{where}: the tokenizer defines {len(tokens)} tokens but the "
                              f"model's vocab_size is {vocab_size}")
    st, ids = special_tokens(src, vocab_size)
    kv.string(K.TOKENIZER_MODEL, TOKENIZER_MODEL)
    kv.array(K.TOKENS, tokens, GGUFValueType.STRING)
    kv.array(K.TOKEN_SCORES, [SCORE] * len(tokens), GGUFValueType.FLOAT32)
    kv.array(K.TOKEN_TYPES, types, GGUFValueType.INT32)
    write_special_vocab_kv(src, merges_of(src), st, ids, kv)
    kv.boolean(K.ADD_SPACE_PREFIX, False)
    kv.boolean(K.ADD_SPECIAL_TOKEN["bos"], True, replace=True)  # Gemma always starts with BOS
    return ids


# ----------------------------------------------------------------------------------------------
# draft layers


def _draft_backbone(g: Gemma4Text) -> Backbone:
    """The generic decoder keys of a Gemma-4 draft: every layer is a global layer."""
    return Backbone(n_layer=g.n_layer, n_ctx=g.n_ctx, n_embd=g.n_embd, n_ff=g.n_ff,
                    n_head=g.n_head, n_head_kv=g.kv_heads(0), explicit_head_dim=g.head_dim_full,
                    rms_eps=g.rms_eps, rope_theta=g.rope_theta_full, rope=RopeScaling("none"),
                    partial_rotary_factor=None, vocab_size=g.vocab_size, tie_word_embeddings=False,
                    is_causal=None)


def _write_draft_kv(g: Gemma4Text, kv: KeyValues) -> None:
    """How a Gemma-4 layer computes, beyond the generic keys."""
    kv.u32(K.ROPE_DIMENSION_COUNT, g.head_dim_full)  # rope_freqs keeps unrotated pairs in place
    kv.f32(K.EMBEDDING_SCALE, g.n_embd ** 0.5)
    kv.f32(K.ATTENTION_SCALE, 1.0)  # q_norm / k_norm take the place of 1/sqrt(head_dim)
    kv.string(K.HIDDEN_ACTIVATION, ACTIVATION)


class Gemma4DraftLayers(DraftLayers):
    """Gemma-4 draft layers (for Gemma-4 targets) keep their sandwich norms and layer scalar
    (`post_attention_norm`, `post_ffw_norm`, `layer_output_scale`), have no V projection (V comes
    from K), and add the keys of their arithmetic: embeddings scaled by sqrt(hidden_size), QK
    scale 1, GELU, the global layers' head size and proportional rope (`rope_freqs.weight`)."""

    name = GGUF_ARCH
    model_types = ("gemma4_text", "gemma4")
    deepspec_renames = {"confidence_proj.": "confidence_head.proj."}

    def check(self, backbone: Config, places: list[Config]) -> None:
        """What the dflash graph cannot run of a Gemma-4 layer: it has one head size, K = V as the
        only Gemma-style value path, a plain MLP, and no per-layer inputs or KV sharing."""
        where = backbone.where
        types = backbone.str_list("layer_types", None)
        if types is not None and set(types) != {"full_attention"}:
            raise ConversionError(f"{where}: field 'layer_types' must be all 'full_attention' for a "
                                  "Gemma-4 draft (sliding layers have another head size; use "
                                  "dflash_config.use_swa for a windowed draft)")
        if not backbone.bool("attention_k_eq_v", False):
            raise ConversionError(f"{where}: field 'attention_k_eq_v' must be true for a Gemma-4 "
                                  "draft (the draft graph derives V from the K projection)")
        refused = (("enable_moe_block", False), ("num_kv_shared_layers", 0),
                   ("hidden_size_per_layer_input", 0), ("attention_bias", False))
        for key, plain in refused:
            if backbone.data.get(key) not in (None, plain):
                raise ConversionError(f"{where}: field {key!r} = {backbone.data[key]!r} is not "
                                      "supported for a Gemma-4 draft")
        if agreed("input_embedding_scale", places, lambda c, k: c.float(k, None)) is not None:
            raise ConversionError(f"{where}: field 'input_embedding_scale': a Gemma-4 draft scales "
                                  "its embeddings by sqrt(hidden_size) already")

    def read(self, backbone: Config) -> DraftBackbone:
        g = read_gemma4(backbone)
        layers = {k: (e.gguf_name, e.shape) for k, e in layer_table(g).items() if e.required}
        return DraftBackbone(_draft_backbone(g), layers, lambda kv: _write_draft_kv(g, kv),
                             rope_freqs(g))


# ----------------------------------------------------------------------------------------------
# the registry's entries (archs/__init__.py)


class Gemma4(TargetArch):
    gguf_arch = GGUF_ARCH
    hf_architectures = tuple(TEXT_PREFIX)

    def plan_target(self, ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, int]:
        plan, g = plan_gemma4_target(ckpt, cfg, out)
        return plan, g.vocab_size

    def target_dims(self, cfg: Config) -> TargetDims:
        g = read_gemma4(text_config(cfg))
        return TargetDims(g.n_layer, g.n_embd, g.vocab_size, TEXT_PREFIX[cfg.architecture()])

    def tokenizer_kv(self, tokenizer_dir: Path, vocab_size: int, kv: KeyValues, ov: Overrides) -> None:
        write_gemma4_tokenizer_kv(tokenizer_dir, vocab_size, kv)


ARCH = Gemma4()
DRAFT_LAYERS = Gemma4DraftLayers()
