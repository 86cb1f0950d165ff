"""Re-quantizing a GGUF model: `dspark-ggml quantize IN.gguf OUT.gguf TYPE`, our own llama-quantize.

TYPE is one of llama-quantize's file types (Q4_K_M, Q6_K, IQ4_NL, Q8_0, F16, ...; any case; Q3_K,
Q4_K and Q5_K mean the _M mixtures there, and here too) or its LLAMA_FTYPE number. Each tensor
gets the type llama-quantize would give it:

* only tensors of two or more dimensions (trailing 1s do not count), whose names end in "weight",
  and that are not norms, MoE routers or one of a few small special tensors are converted; the
  others keep their type;
* the bulk of the matrices get the file type's base type; with a K-quant or IQ4 mixture some get
  more bits: the output head (and a tied token embedding) Q6_K; attn_v and ffn_down by layer
  (the "use more bits" layers: the first and last eighth, and every third one in between); with
  --pure none of this happens;
* a matrix whose rows do not split into the chosen type's blocks falls back to a type with smaller
  blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL), and to
  F16 when even 32 does not divide them.

The rules are restated from llama.cpp's src/llama-quant.cpp (facts only: which tensor, which
type); they depend on the architecture only through Falcon's and glm5-next's exceptions and the
"70B" model size (80-layer llama with GQA, qwen2, ...), which are kept. Types that need an
importance matrix (IQ1/IQ2/IQ3 mixes, Q2_K_S) are refused, as are types whose quantizer this build
does not expose.

The work streams: the input's tensor data is read in chunks of rows, dequantized to f32 and
quantized with ggml's own kernels (the C API releases the GIL, so chunks run on a thread pool),
and written in order. Memory stays at a few chunks whatever the model's size. Metadata is copied
byte for byte, except general.file_type and general.quantization_version (and split.* keys, as
llama-quantize). The output is written to a temporary file in the destination's folder and
renamed over the destination only when complete: an error, a full disk or Ctrl-C leaves no
partial file.
"""
from __future__ import annotations

import errno
import os
import re
import struct
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np

from .errors import DSparkError, FileAccessError, FileFormatError, InvalidArgumentError, UnsupportedError

__all__ = ["FileType", "TensorPlan", "QuantizeSummary", "FILE_TYPES", "resolve_file_type",
           "plan_quantization", "quantize_gguf", "valid_type_names"]

# f32 values per work item (2 MiB of f32); with at most threads + 2 items in flight, this bounds
# the working memory (~ (threads + 2) x 5 MiB), whatever the size of the tensors
CHUNK_VALUES = 1 << 19
# raw bytes per read when a tensor is copied unchanged
COPY_BYTES = 4 << 20

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
_UINT32 = 4  # GGUFValueType.UINT32


# ------------------------------------------------------------------------------------------------
# ggml types (by the gguf package's enum; ggml's own names for the C API and for display)


def _types() -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType


def _quant_sizes(t: Any) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[t]


def ggml_type_name(t: Any) -> str:
    """ggml's spelling of a type: "q4_K", "iq4_nl", "bf16", ..."""
    name = t.name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


def _block_size(t: Any) -> int:
    return _quant_sizes(t)[0]


def _row_bytes(t: Any, n_per_row: int) -> int:
    block, size = _quant_sizes(t)
    return n_per_row // block * size


def _is_quantized(t: Any) -> bool:
    """ggml_is_quantized: every block type; not the float or integer element types."""
    T = _types()
    return t not in (T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64)


def _has_float_values(t: Any) -> bool:
    T = _types()
    return t not in (T.F64, T.I8, T.I16, T.I32, T.I64)


# ------------------------------------------------------------------------------------------------
# file types: llama-quantize's names and LLAMA_FTYPE values


@dataclass(frozen=True)
class FileType:
    """One of llama-quantize's output types."""

    name: str      # as llama-quantize spells it (canonical: Q4_K_M, not the alias Q4_K)
    ftype: int     # LLAMA_FTYPE_* value, written to general.file_type
    base: str      # the ggml type of the bulk of the matrices (gguf enum name)
    description: str = ""

    @property
    def base_type(self) -> Any:
        return _types()[self.base]

    @property
    def is_mixture_capable(self) -> bool:
        """The per-tensor rules apply only when the base type is a block type (as llama-quantize)."""
        return _is_quantized(self.base_type)


FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in (
    FileType("Q4_0", 2, "Q4_0", "4.5 bpw, legacy 32-block"),
    FileType("Q4_1", 3, "Q4_1", "5.0 bpw, legacy 32-block"),
    FileType("Q5_0", 8, "Q5_0", "5.5 bpw, legacy 32-block"),
    FileType("Q5_1", 9, "Q5_1", "6.0 bpw, legacy 32-block"),
    FileType("Q2_K", 10, "Q2_K", "K-quant mix, ~2.6-3 bpw"),
    FileType("Q3_K_S", 11, "Q3_K", "K-quant mix, ~3.4 bpw"),
    FileType("Q3_K_M", 12, "Q3_K", "K-quant mix, ~3.7 bpw"),
    FileType("Q3_K_L", 13, "Q3_K", "K-quant mix, ~4.0 bpw"),
    FileType("IQ4_NL", 25, "IQ4_NL", "4.5 bpw non-linear, mix"),
    FileType("IQ4_XS", 30, "IQ4_XS", "4.25 bpw non-linear, mix"),
    FileType("Q4_K_S", 14, "Q4_K", "K-quant mix, ~4.4 bpw"),
    FileType("Q4_K_M", 15, "Q4_K", "K-quant mix, ~4.6-4.8 bpw"),
    FileType("Q5_K_S", 16, "Q5_K", "K-quant mix, ~5.2 bpw"),
    FileType("Q5_K_M", 17, "Q5_K", "K-quant mix, ~5.3-5.6 bpw"),
    FileType("Q6_K", 18, "Q6_K", "6.6 bpw K-quant"),
    FileType("Q8_0", 7, "Q8_0", "8.5 bpw"),
    FileType("F16", 1, "F16", "16-bit float"),
    FileType("BF16", 32, "BF16", "16-bit bfloat"),
    FileType("F32", 0, "F32", "32-bit float"),
)}

# llama-quantize's aliases: the bare K-quant names are the _M mixtures
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}

# llama-quantize's other names, refused here with the reason
_NEEDS_IMATRIX = ("needs an importance matrix (llama-quantize --imatrix), which `dspark-ggml quantize` "
                  "does not take")
_NO_KERNEL = "ggml's quantizer for it is not exposed by this build"
UNSUPPORTED: dict[str, tuple[int, str]] = {
    "IQ2_XXS": (19, _NEEDS_IMATRIX), "IQ2_XS": (20, _NEEDS_IMATRIX), "IQ2_S": (28, _NEEDS_IMATRIX),
    "IQ2_M": (29, _NEEDS_IMATRIX), "IQ1_S": (24, _NEEDS_IMATRIX), "IQ1_M": (31, _NEEDS_IMATRIX),
    "IQ3_XXS": (23, _NEEDS_IMATRIX), "Q2_K_S": (21, _NEEDS_IMATRIX),
    "IQ3_XS": (22, _NO_KERNEL), "IQ3_S": (26, _NO_KERNEL), "IQ3_M": (27, _NO_KERNEL),
    "TQ1_0": (36, _NO_KERNEL), "TQ2_0": (37, _NO_KERNEL), "MXFP4_MOE": (38, _NO_KERNEL),
    "Q1_0": (40, _NO_KERNEL), "Q2_0": (41, _NO_KERNEL),
    "COPY": (0, "it only copies tensors: copy the file instead"),
}


def valid_type_names() -> list[str]:
    return [*FILE_TYPES, *ALIASES]


def resolve_file_type(name: str) -> FileType:
    """The file type named ``name`` (any case, an alias, or a LLAMA_FTYPE number).

    Raises:
        InvalidArgumentError: an unknown name (the message lists the valid ones).
        UnsupportedError: a type llama-quantize makes that cannot be made here (and why).
    """
    key = str(name).strip().upper()
    key = ALIASES.get(key, key)
    if key.isdigit():
        by_number = {ft.ftype: ft.name for ft in FILE_TYPES.values()}
        by_number.update({n: k for k, (n, _) in UNSUPPORTED.items() if k != "COPY"})
        key = by_number.get(int(key), key)
    if key in FILE_TYPES:
        return FILE_TYPES[key]
    if key in UNSUPPORTED:
        raise UnsupportedError(f"quantize type {name!r} cannot be made here: {UNSUPPORTED[key][1]}")
    # a ggml block type that is no llama-quantize file type (q8_1, q8_K, iq3_s, ...)
    lowered = str(name).strip().lower()
    is_ggml_type = any(ggml_type_name(t).lower() == lowered for t in _types())
    what = "not a file type this command can write" if is_ggml_type else "unknown quantize type"
    raise InvalidArgumentError(f"{what} {name!r}; valid types (any case): {', '.join(valid_type_names())}")


# ------------------------------------------------------------------------------------------------
# which tensors are converted, and to what (llama-quantize's rules)

# substrings of names that are never converted (small or special tensors)
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")
# glm5-next: more small tensors kept, and a few kept at Q8_0 or better
_GLM5_KEEP = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
              "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
              "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
              "attn_v_b.weight")
_GLM5_Q8 = ("attn_q_a", "attn_q_b", "nextn.eh_proj")

# tensor categories (by name, arch-independent)
TOKEN_EMBD, OUTPUT, ATTN_QKV, ATTN_KV_B, ATTN_V, ATTN_K, ATTN_Q, ATTN_OUTPUT = (
    "token_embd", "output", "attn_qkv", "attn_kv_b", "attn_v", "attn_k", "attn_q", "attn_output")
FFN_UP, FFN_GATE, FFN_DOWN, OTHER = "ffn_up", "ffn_gate", "ffn_down", "other"
_ATTN_V_LIKE = (ATTN_V, ATTN_QKV, ATTN_KV_B)

# fallback of a block type whose blocks do not divide a row
_FALLBACK = {"IQ4_XS": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
             "Q6_K": "Q8_0"}

_LAYER = re.compile(r"blk\.([+-]?\d+)")


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: dimensions up to the last one larger than 1 (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def allows_quantization(name: str, shape: Sequence[int], arch: str = "") -> bool:
    """Whether llama-quantize converts this tensor at all (others keep their type)."""
    if n_dims(shape) < 2 or not name.endswith("weight"):
        return False
    if name in _KEEP_NAMES:
        return False
    if arch == "glm5-next" and any(s in name for s in _GLM5_KEEP):
        return False
    return not any(s in name for s in _KEEP_SUBSTRINGS)


def category(name: str) -> str:
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for needle, cat in (("attn_qkv.weight", ATTN_QKV), ("attn_kv_b.weight", ATTN_KV_B),
                        ("attn_v.weight", ATTN_V), ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q),
                        ("attn_output.weight", ATTN_OUTPUT), ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE),
                        ("ffn_down", FFN_DOWN)):
        if needle in name:
            return cat
    return OTHER


def _layer_of(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names: Sequence[str]) -> list[str]:
    """The order llama-quantize visits tensors in (its counters depend on it): tensors outside the
    blocks first, then block by block; by name within each."""
    return sorted(names, key=lambda n: (_layer_of(n), n.encode()))


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """The layers that K-quant _M mixtures give more bits: the first and last eighth and every
    third layer in between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


@dataclass
class ModelFacts:
    """What the rules read from the model besides tensor names."""

    arch: str = ""
    n_layer: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0
    tied_embeddings: bool = True  # no output.weight: the token embedding is also the head

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's LLM_TYPE_70B (a stronger attn_v): 80-layer GQA llama, 80-layer qwen2 (and
        the few other archs whose loaders call 80 layers 70B)."""
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_layer == 80 and self.n_head != self.n_head_kv
        if self.arch in ("qwen2", "deci", "olmo"):
            return self.n_layer == 80
        if self.arch == "jais2":
            return self.n_layer == 68
        return False


class _Mixture:
    """The per-tensor choice of a K-quant / IQ4 / legacy mixture, visited in llama_order.
    Counters count attn_v and ffn_* tensors in that order, as llama-quantize's do."""

    def __init__(self, ft: FileType, facts: ModelFacts, n_attn_v: int) -> None:
        self.ft, self.m = ft.name, facts
        self.n_attn_v, self.i_attn_v = n_attn_v, 0
        self.i_ffn = {FFN_DOWN: 0, FFN_GATE: 0, FFN_UP: 0}
        self.falcon = facts.arch == "falcon"

    def _layer(self, cat: str, name: str) -> tuple[int, int]:
        """(layer index, number of layers) of an ffn tensor: by counting, or by name with experts."""
        i = self.i_ffn[cat]
        if max(1, self.m.n_expert) > 1:
            i = _layer_of(name)
            if not 0 <= i < self.m.n_layer:
                raise FileFormatError(f"cannot tell the layer of tensor {name!r} (expected blk.N. with N < "
                                      f"{self.m.n_layer})")
        return i, self.m.n_layer

    def choose(self, name: str, ncols: int, t: str) -> str:
        """The type (gguf enum name) of one tensor, before the block-size fallback."""
        ft, m, cat = self.ft, self.m, category(name)
        if m.arch == "glm5-next" and any(s in name for s in _GLM5_Q8):
            return "Q8_0"
        if cat == OUTPUT or (cat == TOKEN_EMBD and m.tied_embeddings):
            if self.falcon or ncols % _block_size(_types()[t]) != 0:
                return "Q8_0"
            return t if t == "Q8_0" else "Q6_K"
        if cat == TOKEN_EMBD:
            return t
        if cat in _ATTN_V_LIKE:
            if ft == "Q2_K":
                t = "Q4_K" if m.n_gqa >= 4 else "Q3_K"
            elif ft == "Q3_K_M":
                t = "Q5_K" if self.i_attn_v < 2 else "Q4_K"
            elif ft == "Q3_K_L":
                t = "Q5_K"
            elif ft in ("IQ4_NL", "IQ4_XS") and m.n_gqa >= 4:
                t = "Q5_K"
            elif ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(self.i_attn_v, self.n_attn_v):
                t = "Q6_K"
            elif ft == "Q4_K_S" and self.i_attn_v < 4:
                t = "Q5_K"
            if m.is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
            if m.n_expert == 8:
                t = "Q8_0"
            self.i_attn_v += 1
            return t
        if cat == ATTN_K:
            return "Q8_0" if m.n_expert == 8 else t
        if cat == FFN_DOWN:
            i, n = self._layer(cat, name)
            self.i_ffn[cat] += 1
            if ft == "Q2_K":
                return "Q3_K"
            if ft == "Q3_K_M":
                if i < n // 16:
                    return "Q5_K"
                return "Q4_K" if not self.falcon or use_more_bits(i, n) else "Q3_K"
            if ft == "Q3_K_L":
                return "Q4_K" if self.falcon else "Q5_K"
            if ft == "Q4_K_M":
                if self.falcon:
                    return "Q6_K" if i < n // 16 else "Q5_K" if use_more_bits(i, n) else "Q4_K"
                return "Q6_K" if use_more_bits(i, n) else t
            if i < n // 8 and ft in ("IQ4_NL", "IQ4_XS"):  # (without an importance matrix)
                return "Q5_K"
            if ft == "Q5_K_M":
                return "Q6_K" if use_more_bits(i, n) else t
            if ft == "Q4_K_S" and not self.falcon and i < n // 8:
                return "Q5_K"
            return t
        if cat == ATTN_OUTPUT:
            if self.falcon:
                return "Q4_K" if ft == "Q3_K_L" else t
            if m.n_expert == 8:
                more = ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS")
                return "Q5_K" if ft in more else t
            return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(ft, t)
        if cat in (FFN_GATE, FFN_UP):
            self._layer(cat, name)
            self.i_ffn[cat] += 1
        return t


def fallback_type(t: str, ncols: int) -> str:
    """The type a row of ``ncols`` values can be stored in, starting from block type ``t``."""
    T = _types()
    if ncols % _block_size(T[t]) == 0:
        return t
    if t in _FALLBACK:
        t = _FALLBACK[t]
    elif _block_size(T[t]) > 32:  # pragma: no cover - every 256-block type we write has a fallback
        raise UnsupportedError(f"no fallback type for {t}")
    return t if ncols % _block_size(T[t]) == 0 else "F16"


# ------------------------------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]   # ggml order (row length first), as stored
    src_type: Any            # gguf.GGMLQuantizationType
    dst_type: Any
    src_offset: int          # absolute, in the input
    src_nbytes: int
    fallback: bool = False   # the rows do not split into the chosen type's blocks

    @property
    def converted(self) -> bool:
        return self.src_type != self.dst_type

    @property
    def n_per_row(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= int(d)
        return n

    @property
    def dst_nbytes(self) -> int:
        return self.n_rows * _row_bytes(self.dst_type, self.n_per_row) if self.converted else self.src_nbytes


@dataclass
class QuantizeSummary:
    """What `quantize_gguf` did (or, with ``dry_run``, would do)."""

    src: str
    dst: str
    file_type: FileType
    pure: bool
    tensors: list[TensorPlan]
    seconds: float = 0.0

    @property
    def n_converted(self) -> int:
        return sum(t.converted for t in self.tensors)

    @property
    def n_copied(self) -> int:
        return len(self.tensors) - self.n_converted

    @property
    def n_fallback(self) -> int:
        return sum(t.fallback for t in self.tensors)

    @property
    def src_bytes(self) -> int:
        return sum(t.src_nbytes for t in self.tensors)

    @property
    def dst_bytes(self) -> int:
        return sum(t.dst_nbytes for t in self.tensors)

    @property
    def types(self) -> dict[str, str]:
        """Tensor name -> ggml type name in the output."""
        return {t.name: ggml_type_name(t.dst_type) for t in self.tensors}


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # as stored (ggml order)
    type: Any               # gguf.GGMLQuantizationType
    offset: int             # absolute
    nbytes: int


@dataclass
class _Input:
    """The input GGUF: its metadata entries (raw bytes, and the values the rules read) and tensors."""

    path: str
    kv: list[tuple[str, bytes]]  # (key, the entry's bytes as stored), in file order
    values: dict[str, Any]       # decoded values of the keys in _WANTED_KEYS (by suffix)
    tensors: list[_Tensor]       # in file order
    alignment: int

    def value(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


# GGUF value types: fixed sizes and struct codes of the scalars; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# the keys whose values are decoded (the rules read them): these, and "{arch}.*" ones by suffix
_WANTED_SUFFIXES = (".block_count", ".attention.head_count", ".attention.head_count_kv", ".expert_count")
_WANTED_KEYS = ("general.architecture", "general.alignment", "split.count")


class _Walker:
    """Reads a GGUF header that the C core has validated: entry extents, a few values, tensors."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.off = buf, 0

    def scalar(self, code: str) -> Any:
        v = struct.unpack_from("<" + code, self.buf, self.off)[0]
        self.off += struct.calcsize(code)
        return v

    def string(self) -> str:
        n = self.scalar("Q")
        s = bytes(self.buf[self.off:self.off + n])
        self.off += n
        return s.decode("utf-8", "surrogateescape")  # names go back out byte for byte

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.off += 8 + struct.unpack_from("<Q", self.buf, self.off)[0]
            return None
        if vtype != _ARRAY:
            raise FileFormatError(f"unknown GGUF value type {vtype}")
        item, n = self.scalar("I"), self.scalar("Q")
        if item in _SCALARS and not keep:
            self.off += n * struct.calcsize(_SCALARS[item])
            return None
        if keep:
            return [self.value(item, True) for _ in range(n)]
        for _ in range(n):
            self.value(item, False)
        return None


def _open_input(path: str) -> _Input:
    """Validate with the C core (clear messages for missing, foreign and truncated files), then
    walk the header for each metadata entry's bytes and the tensor table."""
    import mmap

    from .gguf_file import GGUFFile

    if os.path.isdir(path):
        raise FileAccessError(f"{path} is a directory, not a GGUF file")
    with GGUFFile(path) as g:
        version = g.version
    if version < 2:  # 32-bit counts and lengths
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported (convert it again)")
    T = _types()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        w = _Walker(mm)
        try:
            w.off = 8  # magic and version: checked by the C core
            n_tensors, n_kv = w.scalar("Q"), w.scalar("Q")
            kv, values = [], {}
            for _ in range(n_kv):
                start = w.off
                key = w.string()
                keep = key in _WANTED_KEYS or key.endswith(_WANTED_SUFFIXES)
                v = w.value(w.scalar("I"), keep)
                if keep:
                    values[key] = v
                kv.append((key, bytes(mm[start:w.off])))
            infos = []
            for _ in range(n_tensors):
                name = w.string()
                dims = tuple(w.scalar("Q") for _ in range(w.scalar("I")))
                type_id, offset = w.scalar("I"), w.scalar("Q")
                infos.append((name, dims, type_id, offset))
            alignment = int(values.get("general.alignment", 32))
            data_start = w.off + _pad(w.off, alignment)
        except struct.error as e:  # pragma: no cover - the C core validated the header
            raise FileFormatError(f"{path}: malformed GGUF header: {e}") from e
    tensors = []
    for name, dims, type_id, offset in infos:
        try:
            t = T(type_id)
        except ValueError:
            raise UnsupportedError(f"{path}: tensor {name!r} has ggml type {type_id}, unknown to the "
                                   f"gguf package") from None
        n = 1
        for d in dims:
            n *= d
        block, size = _quant_sizes(t)
        tensors.append(_Tensor(name, dims, t, data_start + offset, n // block * size))
    return _Input(path, kv, values, tensors, alignment)


def _first_int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, (list, tuple, np.ndarray)):
        return int(value[0]) if len(value) else default
    return int(value)


def _model_facts(inp: _Input) -> ModelFacts:
    arch = inp.value("general.architecture", "") or ""
    names = [t.name for t in inp.tensors]
    n_layer = _first_int(inp.value(f"{arch}.block_count"), -1)
    if n_layer < 0:  # not a llama.cpp model: count the blocks
        n_layer = 1 + max((_layer_of(n) for n in names), default=-1)
    n_head = _first_int(inp.value(f"{arch}.attention.head_count"))
    n_head_kv = _first_int(inp.value(f"{arch}.attention.head_count_kv"), n_head)
    n_expert = _first_int(inp.value(f"{arch}.expert_count"))
    return ModelFacts(arch=arch, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
                      n_expert=n_expert if n_expert > 1 else 0,
                      tied_embeddings="output.weight" not in names)


def _plan(inp: _Input, ft: FileType, pure: bool) -> list[TensorPlan]:
    T = _types()
    facts = _model_facts(inp)
    by_name = {t.name: t for t in inp.tensors}
    mixture = None
    if ft.is_mixture_capable and not pure:
        n_attn_v = sum(category(n) in _ATTN_V_LIKE for n in by_name)
        mixture = _Mixture(ft, facts, n_attn_v)
    chosen: dict[str, tuple[Any, bool]] = {}
    for name in llama_order(list(by_name)):
        t = by_name[name]
        shape = tuple(int(d) for d in t.shape)
        if not allows_quantization(name, shape, facts.arch):
            chosen[name] = (t.type, False)
            continue
        new = ft.base
        fell_back = False
        if ft.is_mixture_capable:
            if mixture is not None:
                new = mixture.choose(name, shape[0], new)
            fb = fallback_type(new, shape[0])
            fell_back, new = fb != new, fb
        chosen[name] = (T[new], fell_back)
    return [TensorPlan(name=t.name, shape=t.shape, src_type=t.type, dst_type=chosen[t.name][0],
                       src_offset=t.offset, src_nbytes=t.nbytes, fallback=chosen[t.name][1])
            for t in inp.tensors]


def _check_plan(plans: list[TensorPlan], src: str, ft: FileType, allow_requantize: bool) -> None:
    for p in plans:
        if p.converted and not _has_float_values(p.src_type):
            raise UnsupportedError(f"{src}: tensor {p.name!r} is {ggml_type_name(p.src_type)}, "
                                   f"which has no float values to quantize")
    requant = sorted({ggml_type_name(p.src_type) for p in plans if p.converted and _is_quantized(p.src_type)})
    if requant and not allow_requantize:
        raise InvalidArgumentError(
            f"{src} is already quantized ({', '.join(requant)}): requantizing to {ft.name} loses quality "
            f"compared with quantizing from f32/f16/bf16 weights; pass --allow-requantize "
            f"(allow_requantize=True) to do it anyway")


def plan_quantization(src: str | os.PathLike[str], type_name: str, *, pure: bool = False) -> QuantizeSummary:
    """The output type of every tensor of ``src`` for ``type_name``, without writing anything."""
    ft = resolve_file_type(type_name)
    src = os.fspath(src)
    inp = _open_input(src)
    return QuantizeSummary(src=src, dst="", file_type=ft, pure=pure, tensors=_plan(inp, ft, pure))


# ------------------------------------------------------------------------------------------------
# writing


def _gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _kv_u32(key: str, value: int) -> bytes:
    return _gguf_string(key.encode()) + struct.pack("<II", _UINT32, value)


def _metadata(inp: _Input, ft: FileType) -> list[bytes]:
    """The input's entries byte for byte, with general.quantization_version and general.file_type
    set (in place, or appended) and split.* dropped."""
    from gguf import GGML_QUANT_VERSION

    replace = {"general.quantization_version": GGML_QUANT_VERSION, "general.file_type": ft.ftype}
    out: list[bytes] = []
    for key, raw in inp.kv:
        if key.startswith("split."):
            continue
        if key in replace:
            out.append(_kv_u32(key, replace.pop(key)))
        else:
            out.append(raw)
    out += [_kv_u32(k, v) for k, v in replace.items()]
    return out


def _pad(n: int, align: int) -> int:
    return (align - n % align) % align


def _header(inp: _Input, ft: FileType, plans: list[TensorPlan]) -> bytes:
    """Header, metadata and tensor table, padded to where the data starts (tensors in plan order,
    each padded to the alignment)."""
    kvs = _metadata(inp, ft)
    parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(plans), len(kvs)), *kvs]
    offset = 0
    for p in plans:
        info = struct.pack(f"<I{len(p.shape)}QIQ", len(p.shape), *p.shape, int(p.dst_type), offset)
        parts.append(_gguf_string(p.name.encode("utf-8", "surrogateescape")) + info)
        offset += p.dst_nbytes + _pad(p.dst_nbytes, inp.alignment)
    head = b"".join(parts)
    return head + b"\0" * _pad(len(head), inp.alignment)


def _write(f: BinaryIO, data: Any) -> None:
    """Every byte of the output goes through here."""
    f.write(data)


class _Reader:
    """Positioned reads of the input from any thread."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "rb", buffering=0)
        self._lock = threading.Lock()

    def read(self, offset: int, n: int, what: str) -> bytes:
        try:
            if hasattr(os, "pread"):
                data = os.pread(self._f.fileno(), n, offset)
            else:  # pragma: no cover - Windows
                with self._lock:
                    self._f.seek(offset)
                    data = self._f.read(n)
        except OSError as e:  # a read error, not the output's write error
            raise FileAccessError(f"{self._f.name}: cannot read {what}: {e.strerror or e}") from e
        if len(data) != n:
            raise FileFormatError(f"{self._f.name}: truncated while reading {what} (the file changed?)")
        return data

    def close(self) -> None:
        self._f.close()


def _convert_rows(reader: _Reader, p: TensorPlan, row0: int, n_rows: int) -> np.ndarray:
    """Rows [row0, row0+n_rows) of a tensor, read, dequantized to f32 and quantized to its new type."""
    from .quant import dequantize, quantize

    T = _types()
    n = p.n_per_row
    src_row = _row_bytes(p.src_type, n)
    raw = np.frombuffer(reader.read(p.src_offset + row0 * src_row, n_rows * src_row, p.name), dtype=np.uint8)
    if p.src_type == T.F32:
        values = raw.view(np.float32).reshape(n_rows, n)
    else:
        values = dequantize(raw, ggml_type_name(p.src_type), (n_rows, n))
    if p.dst_type == T.F32:
        return values.reshape(-1).view(np.uint8)
    return quantize(values, ggml_type_name(p.dst_type)).reshape(-1)


def _work_items(reader: _Reader,
                plans: list[TensorPlan]) -> Iterator[tuple[TensorPlan, int, Callable[[], Any]]]:
    """(tensor, input bytes it covers, job returning its output bytes), in output order: chunks of
    whole rows for converted tensors, slabs of raw bytes for copied ones."""
    for p in plans:
        if not p.converted:
            for off in range(0, p.src_nbytes, COPY_BYTES):
                size = min(COPY_BYTES, p.src_nbytes - off)
                yield p, size, (lambda p=p, off=off, size=size: reader.read(p.src_offset + off, size, p.name))
        else:
            rows = max(1, CHUNK_VALUES // max(p.n_per_row, 1))
            for r in range(0, p.n_rows, rows):
                k = min(rows, p.n_rows - r)
                n_in = k * _row_bytes(p.src_type, p.n_per_row)
                yield p, n_in, (lambda p=p, r=r, k=k: _convert_rows(reader, p, r, k))


def _stream(fout: BinaryIO, reader: _Reader, plans: list[TensorPlan], align: int, n_threads: int,
            bar: Any) -> None:
    written: dict[str, int] = {}

    def emit(p: TensorPlan, n_in: int, data: Any) -> None:
        _write(fout, data)
        w = written.get(p.name, 0) + memoryview(data).nbytes
        written[p.name] = w
        if w == p.dst_nbytes:
            _write(fout, b"\0" * _pad(w, align))
        bar.set_postfix_str(p.name, refresh=False)
        bar.update(n_in)

    items = _work_items(reader, plans)
    if n_threads <= 1:
        for p, n_in, job in items:
            emit(p, n_in, job())
    else:
        pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="dspark-quantize")
        pending: deque[tuple[TensorPlan, int, Future[Any]]] = deque()
        try:
            for p, n_in, job in items:
                pending.append((p, n_in, pool.submit(job)))
                if len(pending) >= n_threads + 2:
                    q, m, fut = pending.popleft()
                    emit(q, m, fut.result())
            while pending:
                q, m, fut = pending.popleft()
                emit(q, m, fut.result())
        finally:
            for _, _, fut in pending:
                fut.cancel()
            pool.shutdown(wait=True)
    for p in plans:  # zero-byte tensors were never emitted
        if p.dst_nbytes == 0 and p.name not in written:
            written[p.name] = 0
        if written.get(p.name, -1) != p.dst_nbytes:
            raise AssertionError(f"{p.name}: wrote {written.get(p.name)} bytes, planned {p.dst_nbytes}")


def _check_destination(src: str, dst: str) -> None:
    d = Path(dst)
    if d.is_dir():
        raise FileAccessError(f"{dst} is a directory; give the output file name")
    parent = d.parent if str(d.parent) else Path(".")
    if not parent.is_dir():
        raise FileAccessError(f"{dst}: the folder {parent} does not exist")
    same = False
    if d.exists():
        try:
            same = os.path.samefile(src, dst)
        except OSError:
            same = False
    same = same or os.path.realpath(src) == os.path.realpath(dst)
    if same:
        raise InvalidArgumentError(f"the output {dst} is the input file; give another output name")


def _write_error(e: OSError, dst: str) -> DSparkError:
    if e.errno == errno.ENOSPC:
        return FileAccessError(f"{dst}: no space left on the device while writing it (the partial file was "
                               f"removed)")
    if e.errno == errno.EDQUOT:
        return FileAccessError(f"{dst}: disk quota exceeded while writing it (the partial file was removed)")
    return FileAccessError(f"{dst}: cannot write: {e.strerror or e} (the partial file was removed)")


def quantize_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str], type_name: str, *,
                  allow_requantize: bool = False, pure: bool = False, n_threads: int | None = None,
                  progress: bool = True, dry_run: bool = False) -> QuantizeSummary:
    """Write ``dst``: the model ``src`` with its tensors in llama-quantize's types for ``type_name``.

    ``pure`` gives every convertible matrix the base type (no mixture; block-size fallbacks still
    apply). ``allow_requantize`` permits converting tensors that are already quantized (which loses
    quality compared with quantizing from the original weights). ``n_threads``: worker threads for
    the chunks (default: all CPUs). ``dry_run``: only plan, write nothing.

    Raises (all DSparkError): InvalidArgumentError (unknown type, output = input, requantizing
    without ``allow_requantize``), UnsupportedError (a type that cannot be made here),
    FileAccessError (missing input, missing output folder, a write error such as a full disk),
    FileFormatError (the input is not a GGUF or is truncated). Nothing is left at ``dst`` (nor a
    temporary file beside it) unless it succeeds; an existing ``dst`` is replaced only then.
    """
    t0 = time.perf_counter()
    ft = resolve_file_type(type_name)
    src, dst = os.fspath(src), os.fspath(dst)
    if not dry_run:
        _check_destination(src, dst)
    inp = _open_input(src)
    if int(_first_int(inp.value("split.count"), 1)) > 1:
        raise UnsupportedError(f"{src} is one part of a split GGUF; merge the parts first "
                               f"(llama-gguf-split --merge)")
    plans = _plan(inp, ft, pure)
    summary = QuantizeSummary(src=src, dst=dst, file_type=ft, pure=pure, tensors=plans)
    if dry_run:
        return summary
    _check_plan(plans, src, ft, allow_requantize)
    header = _header(inp, ft, plans)
    threads = max(1, int(n_threads) if n_threads else (os.cpu_count() or 1))

    from tqdm import tqdm

    d = Path(dst)
    tmp = d.with_name(f".{d.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    reader = _Reader(src)
    fout = None
    try:
        try:
            fout = open(tmp, "xb")
        except OSError as e:
            raise FileAccessError(f"{dst}: cannot create a file in {d.parent}: {e.strerror or e}") from e
        with tqdm(total=summary.src_bytes, unit="B", unit_scale=True, desc=f"Quantizing to {ft.name}",
                  disable=not progress, file=sys.stderr) as bar:
            try:
                _write(fout, header)
                _stream(fout, reader, plans, inp.alignment, threads, bar)
                fout.flush()
                os.fsync(fout.fileno())
                fout.close()
            except OSError as e:
                if isinstance(e, DSparkError):
                    raise
                raise _write_error(e, dst) from e
        os.replace(tmp, dst)
    except BaseException:  # also KeyboardInterrupt: never leave a partial file
        if fout is not None:
            try:
                fout.close()
            except OSError:
                pass
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    finally:
        reader.close()
    summary.seconds = time.perf_counter() - t0
    return summary
