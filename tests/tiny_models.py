"""Tiny random-weight GGUF models: targets (qwen3, llama, qwen2) and DFlash / DSpark drafts.

Test tooling, not part of the installed package: used by the tests (small models compared against
the numpy references) and the benchmarks (a ~0.6B-parameter random Qwen3 for speed runs).

    from tests.tiny_models import TargetConfig, DraftConfig, write_target, write_draft
    tw = write_target("t.gguf", TargetConfig(arch="qwen3"), seed=0)
    dw = write_draft("d.gguf", DraftConfig(kind="dspark", markov_head_type="gated"), TargetConfig(), seed=1)

The files are written the way the converter writes them (`dspark_ggml.convert`): its metadata
keys, tensor names, layer shapes, storage-type rule, encoders and GGUF writer; only the values
come from here. Weights are drawn one tensor at a time, as the writer asks for them, from a numpy
Generator seeded with (seed, tensor name), so a large model never sits in memory as a whole (pass
return_weights=False), and the same tensor gets the same values whatever else the config adds.

Orientation of the returned weights: every array has the numpy shape gguf-py uses, i.e. the ggml
`ne` reversed. A ggml matrix {in, out} is a numpy [out, in] array (the nn.Linear layout), so
`y = W @ x`; `token_embd.weight` {E, V} is [V, E], one row per token id. Quantized tensors are
returned dequantized: exactly the values the runtime multiplies with. `d2t` is int64.

Storage types (the converter's rule): 2-D matrices follow `dtype`; 1-D tensors (norms, biases,
scales, rope_freqs) stay F32 and `d2t` is I64. A matrix whose row length is not a multiple of the
quant block size falls back to F16 (e.g. `conf_proj.weight` when E+R is not a multiple of 32).
`dtype` may also be one of the types only llama-quantize makes (q4_0 ... q6_k), which the
runtime reads.
"""
from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType, quants

from dspark_ggml.convert import gguf_keys as K
from dspark_ggml.convert.archs.dense import GLOBAL_TENSORS as TARGET_NAMES
from dspark_ggml.convert.archs.gemma4 import gguf_layer_name as gemma4_layer_name
from dspark_ggml.convert.backbone import Backbone, write_backbone_kv
from dspark_ggml.convert.backbone import RopeScaling as BackboneRope
from dspark_ggml.convert.draft_plan import ARCH as DRAFT_ARCH
from dspark_ggml.convert.draft_plan import GLOBAL_NAMES as DRAFT_NAMES
from dspark_ggml.convert.metadata import KeyValues
from dspark_ggml.convert.plan import ModelPlan, PlannedTensor
from dspark_ggml.convert.quant import GGML_QUANTIZED, RUNTIME_OUT_TYPES, OutType, encode, tensor_type
from dspark_ggml.convert.tensor_names import D2T, ROPE_FREQS, layer_tensor_name, layer_tensor_shapes
from dspark_ggml.convert.writer import write_gguf

__all__ = [
    "TargetConfig",
    "DraftConfig",
    "write_target",
    "write_draft",
    "read_gguf_weights",
    "special_token_ids",
    "llama3_rope_factors",
    "LLAMA3_ROPE",
    "MASK_TOKEN",
]

Weights = Dict[str, np.ndarray]
RopeScaling = Union[Tuple[str, float], Tuple[str, float, int]]

TARGET_ARCHS = ("qwen3", "llama", "qwen2")


# Logit std of a head is about HEAD_GAIN (hidden RMS ~1 after the final norm): large enough that
# greedy top-2 gaps are rarely tiny (f16 rounding would flip near-ties), small enough to sample.
_HEAD_GAIN = 3.0
_EMBD_STD = 1.0

# llama3-style rope_freqs (TargetConfig.rope_freqs / DraftConfig.rope_freqs): the converter's
# formula with these constants and original_max_position_embeddings = n_ctx_train.
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

MASK_TOKEN = "<|MASK|>"
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", MASK_TOKEN)
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# ------------------------------------------------------------------------------------------------
# configs


@dataclass
class TargetConfig:
    """A target LLM. `rope_scaling`: None | ("linear", factor) | ("yarn", factor, orig_ctx)."""

    arch: str = "qwen3"                 # qwen3 | llama | qwen2
    n_vocab: int = 320                  # >= 260 so the byte-level tokenizer fits
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx_train: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    tied_embeddings: bool = False       # True: no output.weight, the head is token_embd
    rope_scaling: Optional[RopeScaling] = None
    rope_freqs: bool = False            # write llama3-style `rope_freqs.weight` {head_dim/2}
    dtype: str = "f32"
    with_tokenizer: bool = True         # skipped anyway when n_vocab < 260
    name: str = ""

    @classmethod
    def qwen3_0_6b_shape(cls, **overrides: object) -> "TargetConfig":
        """Qwen3-0.6B's shape (151936 vocab, hidden 1024, 28 layers): ~0.6B random parameters."""
        base = cls(arch="qwen3", n_vocab=151936, n_embd=1024, n_layer=28, n_head=16, n_head_kv=8,
                   head_dim=128, n_ff=3072, n_ctx_train=40960, rope_theta=1e6, tied_embeddings=True)
        return replace(base, **overrides)  # type: ignore[arg-type]

    def validate(self) -> None:
        if self.arch not in TARGET_ARCHS:
            raise ValueError(f"arch must be one of {TARGET_ARCHS}, got {self.arch!r}")
        _check_heads(self.n_head, self.n_head_kv, self.head_dim)
        _out_type(self.dtype)
        if self.rope_scaling is not None:
            kind = self.rope_scaling[0]
            if kind == "linear" and len(self.rope_scaling) == 2:
                pass
            elif kind == "yarn" and len(self.rope_scaling) == 3:
                pass
            else:
                raise ValueError(f"rope_scaling must be ('linear', f) or ('yarn', f, orig_ctx), "
                                 f"got {self.rope_scaling!r}")
            if float(self.rope_scaling[1]) <= 0:
                raise ValueError("rope scaling factor must be > 0")


@dataclass
class DraftConfig:
    """A DFlash / DSpark draft for a given target (n_embd and n_vocab come from the target).

    None fields are filled by `resolve(target_cfg)`: target_layers (evenly spread over 1..n_layer-1),
    mask_token_id (the target's `<|MASK|>` id = n_vocab-1), rope_theta and n_ctx_train (the
    target's), confidence_head (True for DSpark, False for DFlash).
    """

    kind: str = "dspark"                # dspark | dflash (dflash: no Markov head, no confidence)
    n_layer: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    block_size: int = 4
    target_layers: Optional[List[int]] = None  # GGUF convention: id L = input of target layer L
    mask_token_id: Optional[int] = None
    markov_rank: int = 8
    markov_head_type: str = "vanilla"   # vanilla | gated | rnn
    sample_from_anchor: bool = True     # written for every DSpark draft
    confidence_head: Optional[bool] = None  # conf_proj {E+R,1} + bias {1}; None: True for DSpark
    draft_vocab: Optional[int] = None   # Vd < V: d2t + output {E,Vd} + markov_w2 {R,Vd}
    own_embeddings: bool = False        # token_embd {E,V}; else the target's is borrowed
    own_head: bool = False              # output {E,Vd}; else own token_embd (tied) or the target's
    shared_kv: bool = False             # no attn_v: V = weightless RMSNorm of the raw K projection
    causal: Optional[bool] = None       # None: key not written (runtime default: non-causal)
    fc_scale: bool = False              # fc.scale {1}
    markov_w2_scale: bool = False       # markov_w2.scale {1}
    post_norms: bool = False            # blk.N.post_attention_norm / post_ffw_norm
    layer_output_scale: bool = False    # blk.N.layer_output_scale.weight {1}
    hidden_activation: Optional[str] = None  # None (SiLU) | "silu" | "gelu" | "gelu_pytorch_tanh"
    embedding_scale: Optional[float] = None
    logit_softcap: Optional[float] = None  # dflash.final_logit_softcapping (Gemma-4 drafts)
    attention_scale: Optional[float] = None  # None: 1/sqrt(head_dim)
    value_scale: Optional[float] = None
    sliding_window: int = 0             # > 0: dflash.attention.sliding_window (+ per-layer pattern)
    sliding_window_pattern: Optional[List[bool]] = None  # None with a window: every layer is SWA
    rope_theta: Optional[float] = None
    rope_freqs: bool = False            # llama3-style rope_freqs.weight, as for the target
    rms_eps: float = 1e-6
    n_ctx_train: Optional[int] = None
    dtype: str = "f32"
    name: str = ""

    @property
    def is_dspark(self) -> bool:
        return self.kind == "dspark"

    def resolve(self, target: TargetConfig) -> "DraftConfig":
        """A copy with every None default filled from the target; validated."""
        if self.target_layers is not None:
            layers = list(self.target_layers)
        else:
            layers = _default_target_layers(target.n_layer)
        pattern = self.sliding_window_pattern
        if self.sliding_window > 0 and pattern is None:
            pattern = [True] * self.n_layer
        vd = self.draft_vocab if self.draft_vocab is not None and self.draft_vocab < target.n_vocab else None
        out = replace(
            self,
            target_layers=layers,
            mask_token_id=self.mask_token_id if self.mask_token_id is not None
            else special_token_ids(target.n_vocab)[MASK_TOKEN],
            rope_theta=self.rope_theta if self.rope_theta is not None else target.rope_theta,
            n_ctx_train=self.n_ctx_train if self.n_ctx_train is not None else target.n_ctx_train,
            sliding_window_pattern=list(pattern) if pattern is not None else None,
            draft_vocab=vd,
            confidence_head=self.confidence_head if self.confidence_head is not None else self.is_dspark,
        )
        out._validate(target)
        return out

    def _validate(self, target: TargetConfig) -> None:
        target.validate()
        if self.kind not in ("dspark", "dflash"):
            raise ValueError(f"kind must be 'dspark' or 'dflash', got {self.kind!r}")
        _check_heads(self.n_head, self.n_head_kv, self.head_dim)
        _out_type(self.dtype)
        if self.markov_head_type not in ("vanilla", "gated", "rnn"):
            raise ValueError(f"markov_head_type must be vanilla|gated|rnn, got {self.markov_head_type!r}")
        if self.is_dspark and self.markov_rank <= 0:
            raise ValueError("a DSpark draft needs markov_rank > 0")
        if self.confidence_head and not self.is_dspark:
            raise ValueError("the confidence head needs the Markov head (kind='dspark')")
        if self.block_size <= 0:
            raise ValueError("block_size must be > 0")
        if not self.target_layers or any(not 0 <= i <= target.n_layer for i in self.target_layers):
            raise ValueError(f"target_layers must be non-empty ids in 0..{target.n_layer}")
        assert self.mask_token_id is not None
        if not 0 <= self.mask_token_id < target.n_vocab:
            raise ValueError("mask_token_id out of the target vocabulary")
        if self.draft_vocab is not None:
            if self.draft_vocab <= 0:
                raise ValueError("draft_vocab must be > 0")
            if not self.own_head:
                raise ValueError("a reduced draft vocabulary needs its own head (own_head=True)")
        if self.hidden_activation not in (None, "silu", "gelu", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported hidden_activation {self.hidden_activation!r}")
        if self.sliding_window > 0:
            if self.sliding_window_pattern is None or len(self.sliding_window_pattern) != self.n_layer:
                raise ValueError("sliding_window_pattern needs one bool per draft layer")


def _check_heads(n_head: int, n_head_kv: int, head_dim: int) -> None:
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv != 0:
        raise ValueError(f"n_head ({n_head}) must be a positive multiple of n_head_kv ({n_head_kv})")
    if head_dim <= 0 or head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even and > 0, got {head_dim}")


def _default_target_layers(n_layer: int) -> List[int]:
    """Up to 3 ids spread over 1..n_layer-1 (0 is the raw embedding; n_layer is not captured by qwen3)."""
    if n_layer < 2:
        return [0]
    ids = np.linspace(1, n_layer - 1, num=min(3, n_layer - 1)).round().astype(int)
    return sorted(set(int(i) for i in ids))


def special_token_ids(n_vocab: int) -> Dict[str, int]:
    """Ids of the special tokens: the last four of the vocabulary, whether or not a tokenizer is written."""
    return {tok: n_vocab - len(_SPECIAL_TOKENS) + i for i, tok in enumerate(_SPECIAL_TOKENS)}


def llama3_rope_factors(head_dim: int, rope_theta: float, original_ctx: int,
                        factor: float = 8.0, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0) -> np.ndarray:
    """Per-pair frequency divisors [head_dim/2] of llama3 rope scaling (ggml divides theta by them)."""
    inv_freq = rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = original_ctx / low_freq_factor      # longer than this: fully interpolated
    high_wavelen = original_ctx / high_freq_factor    # shorter than this: untouched
    smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1.0 / ((1.0 - smooth) / factor + smooth)
    out = np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor, mid))
    return out.astype(np.float32)


# ------------------------------------------------------------------------------------------------
# tensor plan: what to write, and how to draw it


Init = Callable[[np.random.Generator, Tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: Tuple[int, ...]   # numpy shape (ggml ne reversed)
    init: Init


def _normal(std: float) -> Init:
    """Zero-mean values of the given std. Uniform rather than Gaussian: numpy draws uniform float32
    about 3x faster, which is most of the time spent writing a 0.6B-parameter model."""
    def draw(rng: np.random.Generator, shape: Tuple[int, ...]) -> np.ndarray:
        x = rng.random(shape, dtype=np.float32)
        x -= np.float32(0.5)
        x *= np.float32(std * math.sqrt(12.0))
        return x
    return draw


def _linear(gain: float = 1.0) -> Init:
    """std = gain / sqrt(fan_in): outputs keep the scale of a unit-RMS input."""
    return lambda rng, shape: _normal(gain / math.sqrt(shape[-1]))(rng, shape)


def _norm_weight() -> Init:
    return lambda rng, shape: 1.0 + _normal(0.1)(rng, shape)


def _bias(std: float = 0.05) -> Init:
    return _normal(std)


def _uniform(lo: float, hi: float) -> Init:
    return lambda rng, shape: rng.uniform(lo, hi, size=shape).astype(np.float32)


def _fixed(values: np.ndarray) -> Init:
    return lambda rng, shape: values.reshape(shape)


def _target_backbone(cfg: TargetConfig) -> Backbone:
    """The target as the converter's decoder description (keys and layer shapes come from it)."""
    rope = BackboneRope("none")
    if cfg.rope_scaling is not None:
        kind, factor, *orig_ctx = cfg.rope_scaling
        rope = BackboneRope(kind, factor=float(factor),
                            original_context_length=int(orig_ctx[0]) if orig_ctx else None)
    return Backbone(n_layer=cfg.n_layer, n_ctx=cfg.n_ctx_train, n_embd=cfg.n_embd, n_ff=cfg.n_ff,
                    n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, explicit_head_dim=cfg.head_dim,
                    rms_eps=cfg.rms_eps, rope_theta=cfg.rope_theta, rope=rope,
                    partial_rotary_factor=None, vocab_size=cfg.n_vocab,
                    tie_word_embeddings=cfg.tied_embeddings, is_causal=None)


def _draft_backbone(cfg: DraftConfig, target: TargetConfig) -> Backbone:
    assert cfg.rope_theta is not None and cfg.n_ctx_train is not None
    return Backbone(n_layer=cfg.n_layer, n_ctx=cfg.n_ctx_train, n_embd=target.n_embd, n_ff=cfg.n_ff,
                    n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, explicit_head_dim=cfg.head_dim,
                    rms_eps=cfg.rms_eps, rope_theta=cfg.rope_theta, rope=BackboneRope("none"),
                    partial_rotary_factor=None, vocab_size=target.n_vocab,
                    tie_word_embeddings=False, is_causal=None)


def _layer_init(part: str) -> Init:
    """Norm weights around 1, small biases, unit-gain projections."""
    if part.endswith("norm.weight"):
        return _norm_weight()
    if part.endswith(".bias"):
        return _bias()
    return _linear()


def _layer_tensors(bb: Backbone, i: int, *, qk_norm: bool, qkv_bias: bool = False,
                   skip: Tuple[str, ...] = ()) -> List[_Tensor]:
    """Layer i's tensors as the converter names and shapes them (HF parts in `skip` left out)."""
    shapes = layer_tensor_shapes(bb, qk_norm=qk_norm, qkv_bias=qkv_bias)
    return [_Tensor(layer_tensor_name(f"layers.{i}.{part}")[2], shape, _layer_init(part))
            for part, shape in shapes.items() if part not in skip]


def _rope_freqs(head_dim: int, rope_theta: float, n_ctx_train: int) -> _Tensor:
    factors = llama3_rope_factors(head_dim, rope_theta, n_ctx_train, **LLAMA3_ROPE)
    return _Tensor(ROPE_FREQS, (head_dim // 2,), _fixed(factors))


def _target_tensors(cfg: TargetConfig) -> List[_Tensor]:
    bb = _target_backbone(cfg)
    E, V = cfg.n_embd, cfg.n_vocab
    out = [_Tensor(TARGET_NAMES["model.embed_tokens.weight"], (V, E), _normal(_EMBD_STD))]
    if cfg.rope_freqs:
        out.append(_rope_freqs(cfg.head_dim, cfg.rope_theta, cfg.n_ctx_train))
    for i in range(cfg.n_layer):
        out += _layer_tensors(bb, i, qk_norm=cfg.arch == "qwen3", qkv_bias=cfg.arch == "qwen2")
    out.append(_Tensor(TARGET_NAMES["model.norm.weight"], (E,), _norm_weight()))
    if not cfg.tied_embeddings:
        out.append(_Tensor(TARGET_NAMES["lm_head.weight"], (V, E), _linear(_HEAD_GAIN)))
    return out


def _draft_tensors(cfg: DraftConfig, target: TargetConfig, seed: int) -> List[_Tensor]:
    E, V = target.n_embd, target.n_vocab
    Vd = cfg.draft_vocab if cfg.draft_vocab is not None else V
    assert cfg.target_layers is not None and cfg.rope_theta is not None and cfg.n_ctx_train is not None
    out: List[_Tensor] = []
    if cfg.own_embeddings:
        out.append(_Tensor(DRAFT_NAMES["embed_tokens.weight"], (V, E), _normal(_EMBD_STD)))
    if cfg.own_head:
        out.append(_Tensor(DRAFT_NAMES["lm_head.weight"], (Vd, E), _linear(_HEAD_GAIN)))
    out.append(_Tensor(DRAFT_NAMES["fc.weight"], (E, len(cfg.target_layers) * E), _linear()))
    if cfg.fc_scale:
        out.append(_Tensor("fc.scale", (1,), _uniform(0.5, 1.5)))  # runtime-only: no HF source
    out += [_Tensor(DRAFT_NAMES["hidden_norm.weight"], (E,), _norm_weight()),
            _Tensor(DRAFT_NAMES["norm.weight"], (E,), _norm_weight())]
    if cfg.rope_freqs:
        out.append(_rope_freqs(cfg.head_dim, cfg.rope_theta, cfg.n_ctx_train))
    bb = _draft_backbone(cfg, target)
    for i in range(cfg.n_layer):
        out += _draft_layer_tensors(cfg, bb, i)
    if cfg.is_dspark:
        out += _markov_tensors(cfg, E, V, Vd, cfg.markov_rank)
    if cfg.draft_vocab is not None:
        # absolute target ids of the draft rows: a sorted random subset (the converter's layout)
        ids = np.sort(np.random.default_rng([seed, zlib.crc32(b"d2t")]).choice(V, Vd, replace=False))
        out.append(_Tensor(D2T, (Vd,), _fixed(ids.astype(np.int64))))
    return out


def _draft_layer_tensors(cfg: DraftConfig, bb: Backbone, i: int) -> List[_Tensor]:
    """A Qwen3 layer; shared_kv drops V, post_norms / layer_output_scale add Gemma-4's parts."""
    skip = ("self_attn.v_proj.weight",) if cfg.shared_kv else ()
    out = _layer_tensors(bb, i, qk_norm=True, skip=skip)
    if cfg.post_norms:
        out += [_Tensor(gemma4_layer_name(i, part), (bb.n_embd,), _norm_weight())
                for part in ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")]
    if cfg.layer_output_scale:
        out.append(_Tensor(gemma4_layer_name(i, "layer_scalar"), (1,), _uniform(0.5, 1.5)))
    return out


def _markov_tensors(cfg: DraftConfig, E: int, V: int, Vd: int, R: int) -> List[_Tensor]:
    # ggml shapes: markov_w1 {R,V}, markov_w2 {R,Vd}, markov_gate {E+R,R}, markov_joint {2R+E,3R},
    # conf_proj {E+R,1}. The bias W2.e has std ~1: it moves the argmax often enough to matter.
    n = {part: DRAFT_NAMES[f"markov_head.{part}"] for part in (
        "markov_w1.weight", "markov_w2.weight", "gate_proj.weight", "gate_proj.bias",
        "joint_proj.weight", "joint_proj.bias")}
    out = [_Tensor(n["markov_w1.weight"], (V, R), _normal(1.0)),
           _Tensor(n["markov_w2.weight"], (Vd, R), _linear(1.0))]
    if cfg.markov_w2_scale:
        out.append(_Tensor("markov_w2.scale", (1,), _uniform(0.5, 1.5)))  # runtime-only
    if cfg.markov_head_type == "gated":
        out += [_Tensor(n["gate_proj.weight"], (R, E + R), _linear()),
                _Tensor(n["gate_proj.bias"], (R,), _bias(0.1))]
    elif cfg.markov_head_type == "rnn":
        out += [_Tensor(n["joint_proj.weight"], (3 * R, 2 * R + E), _linear()),
                _Tensor(n["joint_proj.bias"], (3 * R,), _bias(0.1))]
    if cfg.confidence_head:
        out += [_Tensor(DRAFT_NAMES["confidence_head.proj.weight"], (1, E + R), _linear()),
                _Tensor(DRAFT_NAMES["confidence_head.proj.bias"], (1,), _bias(0.1))]
    return out


# ------------------------------------------------------------------------------------------------
# metadata: the converter's keys; the backbone's through its own writer


def _general_kv(kv: KeyValues, name: str, dtype: str) -> None:
    kv.string(K.NAME, name)
    kv.u32(K.FILE_TYPE, int(_out_type(dtype).file_type))
    kv.u32(K.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION)


def _target_kv(cfg: TargetConfig) -> KeyValues:
    kv = KeyValues(cfg.arch)
    _general_kv(kv, cfg.name or f"tiny-random-{cfg.arch}", cfg.dtype)
    write_backbone_kv(_target_backbone(cfg), kv)  # rope scaling keys included
    if cfg.arch == "llama":  # as the converter's llama layout
        kv.u32(K.VOCAB_SIZE, cfg.n_vocab)
        kv.u32(K.ROPE_DIMENSION_COUNT, cfg.head_dim)
    if cfg.with_tokenizer:
        _tokenizer_kv(kv, cfg.n_vocab)
    return kv


def _draft_kv(cfg: DraftConfig, target: TargetConfig) -> KeyValues:
    assert cfg.target_layers is not None and cfg.mask_token_id is not None
    kv = KeyValues(DRAFT_ARCH)
    _general_kv(kv, cfg.name or f"tiny-random-{cfg.kind}", cfg.dtype)
    write_backbone_kv(_draft_backbone(cfg, target), kv)
    kv.u32(K.BLOCK_SIZE, cfg.block_size)
    kv.array(K.TARGET_LAYERS, [int(i) for i in cfg.target_layers], GGUFValueType.INT32)
    if cfg.is_dspark:
        kv.boolean(K.SAMPLE_FROM_ANCHOR, cfg.sample_from_anchor)
        kv.boolean(K.HAS_CONFIDENCE_HEAD, bool(cfg.confidence_head))
        kv.string(K.MARKOV_HEAD_TYPE, cfg.markov_head_type)
    if cfg.causal is not None:
        kv.boolean(K.CAUSAL, cfg.causal)
    if cfg.hidden_activation is not None:
        kv.string(K.HIDDEN_ACTIVATION, cfg.hidden_activation)
    for key, value in ((K.EMBEDDING_SCALE, cfg.embedding_scale),
                       (K.FINAL_LOGIT_SOFTCAPPING, cfg.logit_softcap),
                       (K.ATTENTION_SCALE, cfg.attention_scale), (K.VALUE_SCALE, cfg.value_scale)):
        if value is not None:
            kv.f32(key, value)
    if cfg.sliding_window > 0:
        assert cfg.sliding_window_pattern is not None
        kv.u32(K.SLIDING_WINDOW, cfg.sliding_window)
        kv.array(K.SLIDING_WINDOW_PATTERN, [bool(b) for b in cfg.sliding_window_pattern],
                 GGUFValueType.BOOL)
    # the draft carries the target's tokenizer (the converter copies it), plus the MASK id
    if target.with_tokenizer:
        _tokenizer_kv(kv, target.n_vocab)
    kv.u32(K.MASK_TOKEN_ID, cfg.mask_token_id)
    return kv


# ------------------------------------------------------------------------------------------------
# byte-level BPE tokenizer (valid, not good)

_BPE_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A speculative decoder drafts a block of tokens "
    "and the target model verifies them in one batch. Hello, world! What is the capital of France? "
    "The answer is Paris. def main(): return 0 # 1234567890 the then there these those this that "
    "in on at is it its and an as of or for from with without into onto upon the the the"
)


def _byte_symbols() -> List[str]:
    """GPT-2's byte -> printable unicode map: printable Latin-1 bytes map to themselves, the others
    to 256, 257, ... in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    symbols, n_moved = [], 0
    for b in range(256):
        if b in keep:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + n_moved))
            n_moved += 1
    return symbols


def _train_bpe(max_merges: int) -> List[Tuple[str, str]]:
    """Greedy BPE on the built-in corpus (most frequent adjacent pair first, ties by text)."""
    symbols = _byte_symbols()
    words = re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", _BPE_CORPUS)
    counts = Counter(tuple(symbols[b] for b in w.encode("utf-8")) for w in words)
    merges: List[Tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter = Counter()
        for word, n in counts.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda pr: (-pairs[pr], pr))
        merges.append(best)
        counts = Counter({_merge_word(word, best): n for word, n in counts.items()})
    return merges


def _merge_word(word: Tuple[str, ...], pair: Tuple[str, str]) -> Tuple[str, ...]:
    out: List[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _tokenizer_kv(kv: KeyValues, n_vocab: int) -> None:
    """ids 0..255 the byte symbols, then merged tokens, then [PADi] fillers, then the 4 specials."""
    n_free = n_vocab - 256 - len(_SPECIAL_TOKENS)
    if n_free < 0:
        return  # too small a vocabulary for a byte-level tokenizer: write none
    tokens = _byte_symbols()
    types = [int(gguf.TokenType.NORMAL)] * 256
    merges = []
    for a, b in _train_bpe(n_free):
        merges.append(f"{a} {b}")
        if a + b not in tokens[256:]:  # two merge paths can spell the same token
            tokens.append(a + b)
            types.append(int(gguf.TokenType.NORMAL))
    while len(tokens) < n_vocab - len(_SPECIAL_TOKENS):
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(int(gguf.TokenType.UNUSED))
    tokens += list(_SPECIAL_TOKENS)
    types += [int(gguf.TokenType.CONTROL)] * len(_SPECIAL_TOKENS)
    ids = special_token_ids(n_vocab)
    kv.string(K.TOKENIZER_MODEL, "gpt2")
    kv.string(K.TOKENIZER_PRE, "qwen2")
    kv.array(K.TOKENS, tokens, GGUFValueType.STRING)
    kv.array(K.TOKEN_TYPES, types, GGUFValueType.INT32)
    if merges:  # GGUF arrays cannot be empty: a vocabulary with no room for merges has none
        kv.array(K.MERGES, merges, GGUFValueType.STRING)
    kv.u32(K.SPECIAL_TOKEN_ID["bos"], ids["<|endoftext|>"])
    kv.u32(K.SPECIAL_TOKEN_ID["eos"], ids["<|endoftext|>"])
    kv.u32(gguf.Keys.Tokenizer.EOT_ID, ids["<|im_end|>"])  # the converter leaves EOT to the runtime
    kv.u32(K.SPECIAL_TOKEN_ID["pad"], ids["<|endoftext|>"])
    kv.boolean(K.ADD_SPECIAL_TOKEN["bos"], False)
    kv.string(K.CHAT_TEMPLATE, _CHATML_TEMPLATE)


# ------------------------------------------------------------------------------------------------
# writing: the converter's plan and writer, with sources that draw the weights


def _out_type(dtype: str) -> OutType:
    if dtype not in RUNTIME_OUT_TYPES:
        raise ValueError(f"dtype must be one of {sorted(RUNTIME_OUT_TYPES)}, got {dtype!r}")
    return RUNTIME_OUT_TYPES[dtype]


def _storage_type(t: _Tensor, out: OutType) -> QT:
    """The converter's rule (1-D tensors F32, matrices `out`, F16 where rows do not split into
    blocks); d2t holds ids, I64 as the converter writes it."""
    return QT.I64 if t.name == D2T else tensor_type(t.name, t.shape, out)


def _decode(stored: np.ndarray, qtype: QT, shape: Tuple[int, ...]) -> np.ndarray:
    """What the runtime multiplies with: the stored values, dequantized."""
    if qtype == QT.I64:
        return stored.reshape(shape)
    if qtype in (QT.F32, QT.F16):
        return stored.astype(np.float32).reshape(shape)
    if qtype in GGML_QUANTIZED:
        from dspark_ggml.quant import dequantize
        return dequantize(stored, GGML_QUANTIZED[qtype], shape)
    return quants.dequantize(stored, qtype).astype(np.float32).reshape(shape)


@dataclass(frozen=True)
class _Drawn:
    """A tensor source for the converter's writer: drawn when written, from a generator seeded
    with (seed, name), so a large model never sits in memory and a tensor's values do not depend
    on what else the config adds. With `keep`, the decoded stored values are put there."""

    tensor: _Tensor
    seed: int
    qtype: QT
    keep: Optional[Weights]

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.tensor.shape

    def blocks(self, max_bytes: int) -> Iterator[np.ndarray]:
        t = self.tensor
        values = t.init(np.random.default_rng([self.seed, zlib.crc32(t.name.encode())]), t.shape)
        if self.keep is not None:  # encoded twice (here and by the writer): cheap for test sizes
            self.keep[t.name] = _decode(encode(values, self.qtype), self.qtype, t.shape)
        yield values


def _write(path: Union[str, Path], arch: str, kv: KeyValues, tensors: List[_Tensor], dtype: str,
           seed: int, return_weights: bool) -> Weights:
    out = _out_type(dtype)
    weights: Weights = {}
    plan = ModelPlan(arch, kv)
    for t in tensors:
        qtype = _storage_type(t, out)
        plan.add(PlannedTensor(t.name, _Drawn(t, seed, qtype, weights if return_weights else None),
                               qtype))
    write_gguf(plan, Path(path), force=True, progress=False)
    return weights


def write_target(path: Union[str, Path], cfg: TargetConfig, seed: int = 0,
                 return_weights: bool = True) -> Weights:
    """Write a random target GGUF; return its weights as the runtime sees them (see module doc).

    llama: the q/k weights are taken to be already in the converter's permuted layout, i.e. the
    runtime applies normal (non-NEOX) rope to them directly. To build the equivalent Hugging Face
    model, undo the permutation per head: hf_row[h, j] = gguf_row[h, 2j], hf_row[h, j+D/2] =
    gguf_row[h, 2j+1].
    """
    cfg.validate()
    return _write(path, cfg.arch, _target_kv(cfg), _target_tensors(cfg), cfg.dtype, seed,
                  return_weights)


def write_id_target(folder: Path, n_vocab: int, n_layer: int, seed: int = 5) -> Tuple[TargetConfig, Any]:
    """A target without a tokenizer (for tests on token ids) at folder/t.gguf: its config and the
    loaded :class:`dspark_ggml.model.Model`."""
    from dspark_ggml.model import Model

    cfg = TargetConfig(n_vocab=n_vocab, n_layer=n_layer, with_tokenizer=False)
    write_target(folder / "t.gguf", cfg, seed=seed)
    return cfg, Model(folder / "t.gguf")


# Target variants checked against transformers (TargetConfig fields): each architecture, rope
# scalings, tied embeddings, grouped and plain attention.
HF_TARGET_VARIANTS: Dict[str, Dict[str, Any]] = {
    "qwen3": dict(arch="qwen3", n_embd=48),  # q width 64 != n_embd 48
    "qwen3-yarn": dict(arch="qwen3", rope_scaling=("yarn", 4.0, 64), n_ctx_train=256),
    "qwen3-tied": dict(arch="qwen3", tied_embeddings=True, n_head_kv=1),
    "llama": dict(arch="llama", n_head_kv=4),
    "llama-rope-freqs": dict(arch="llama", rope_freqs=True, n_ctx_train=512),
    "qwen2": dict(arch="qwen2"),
    "qwen2-linear": dict(arch="qwen2", rope_scaling=("linear", 2.0)),
}


def greedy_decode(ctx: Any, prompt: List[int], n: int) -> List[int]:
    """``n`` tokens after ``prompt``, each the argmax of the last logits, decoded one by one."""
    ctx.decode(prompt)
    got: List[int] = []
    for _ in range(n):
        got.append(int(np.argmax(ctx.get_logits()[-1])))
        ctx.decode([got[-1]])
    return got


def write_draft(path: Union[str, Path], cfg: DraftConfig, target_cfg: TargetConfig, seed: int = 0,
                return_weights: bool = True) -> Weights:
    """Write a random DFlash/DSpark draft GGUF for `target_cfg`; return only the draft's own tensors.

    Borrowed tensors (token_embd, output) are the target's: pass both weight dicts to DraftRef.
    Extra GGUF definitions of this project (non-vanilla Markov heads), beyond llama.cpp's:
      dflash.markov_head_type  STRING, written for every DSpark draft
      gated: markov_gate.weight {E+R, R}, markov_gate.bias {R}
      rnn:   markov_joint.weight {2R+E, 3R}, markov_joint.bias {3R}
    """
    rcfg = cfg.resolve(target_cfg)
    return _write(path, DRAFT_ARCH, _draft_kv(rcfg, target_cfg), _draft_tensors(rcfg, target_cfg, seed),
                  rcfg.dtype, seed, return_weights)


def read_gguf_weights(path: Union[str, Path]) -> Weights:
    """Every tensor of a GGUF file as float32 (dequantized; I32/I64 kept), numpy shape = ne reversed."""
    reader = gguf.GGUFReader(str(path))
    out: Weights = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        qtype = QT(int(t.tensor_type))
        if qtype in (QT.I64, QT.I32, QT.I16, QT.I8):
            out[t.name] = np.array(t.data).reshape(shape)
        elif qtype in (QT.F32, QT.F16, QT.F64):
            out[t.name] = np.array(t.data, dtype=np.float32).reshape(shape)
        else:
            out[t.name] = quants.dequantize(np.array(t.data), qtype).astype(np.float32).reshape(shape)
    return out
