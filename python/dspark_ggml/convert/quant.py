"""Output types: which GGML type each tensor gets, and the encoding of f32 rows into it.

The per-tensor rule is llama.cpp's converter's: 1-D tensors, `*_norm.weight`, MoE routers
(`ffn_gate_inp*.weight`) and anything that is not a `.weight` (biases, scales) stay F32; the
other matrices (3-D expert tensors included) take the requested type; a quantized type falls back
to F16 for a matrix whose rows do not split into its blocks. Encoding uses the `gguf` package's
quantizers, which are bit-exact with ggml's reference ones, and ggml's own kernels (the runtime
library) for the K-quants, which the `gguf` package cannot quantize.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
from gguf.quants import quantize

from .errors import ConversionError
from .safetensors_io import Checkpoint

Q = GGMLQuantizationType

# kept in F32 whatever the outtype (llama.cpp's converter and quantizer agree on these)
_ALWAYS_F32 = re.compile(r"^blk\.\d+\.ffn_gate_inp(_shexp)?\.weight$")


@dataclass(frozen=True)
class OutType:
    name: str
    matrix_type: GGMLQuantizationType  # what 2-D weights become
    file_type: LlamaFileType  # general.file_type


OUT_TYPES = {
    "f32": OutType("f32", Q.F32, LlamaFileType.ALL_F32),
    "f16": OutType("f16", Q.F16, LlamaFileType.MOSTLY_F16),
    "bf16": OutType("bf16", Q.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": OutType("q8_0", Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
OUTTYPE_CHOICES = (*OUT_TYPES, "auto")

# Every type the runtime reads: the converter's, plus block types that only llama-quantize makes.
# The converter does not offer the latter (neither does llama.cpp's); the tiny test models are
# written in them to exercise the runtime's quantized kernels.
RUNTIME_OUT_TYPES = {
    **OUT_TYPES,
    "q4_0": OutType("q4_0", Q.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": OutType("q4_1", Q.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q5_0": OutType("q5_0", Q.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "q5_1": OutType("q5_1", Q.Q5_1, LlamaFileType.MOSTLY_Q5_1),
    "q4_k": OutType("q4_k", Q.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q5_k": OutType("q5_k", Q.Q5_K, LlamaFileType.MOSTLY_Q5_K_M),
    "q6_k": OutType("q6_k", Q.Q6_K, LlamaFileType.MOSTLY_Q6_K),
}

# gguf-py 0.19 has no quantizer for these: ggml's kernels, by the runtime's type name
GGML_QUANTIZED = {Q.Q4_K: "q4_k", Q.Q5_K: "q5_k", Q.Q6_K: "q6_k"}


def resolve_outtype(name: str, checkpoint: Checkpoint) -> OutType:
    """`auto` keeps bf16 or f16 checkpoints in their type and makes f32 ones f16 (as llama.cpp)."""
    if name in OUT_TYPES:
        return OUT_TYPES[name]
    if name != "auto":
        raise ConversionError(f"unknown --outtype {name!r} (choose from {', '.join(OUTTYPE_CHOICES)})")
    for ref in checkpoint.values():
        if len(ref.shape) >= 2 and ref.dtype in ("BF16", "F16"):
            return OUT_TYPES["bf16" if ref.dtype == "BF16" else "f16"]
    return OUT_TYPES["f16"]


def tensor_type(gguf_name: str, shape: tuple[int, ...], out: OutType) -> GGMLQuantizationType:
    """GGML type of one float tensor (`shape` in PyTorch order)."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight") \
            or _ALWAYS_F32.match(gguf_name):
        return Q.F32
    block = GGML_QUANT_SIZES[out.matrix_type][0]
    if shape[-1] % block != 0:
        return Q.F16  # llama.cpp's fallback when a quantized type cannot hold the row
    return out.matrix_type


def encoded_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = math.prod(shape)
    if n % block:
        raise ValueError(f"{n} elements do not split into {qtype.name} blocks")
    return n // block * type_size


def encode(rows: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Encode a block of whole rows (any float dtype, or int64 for I64) for the file."""
    if qtype == Q.I64:
        return rows.astype("<i8", copy=False)
    if qtype == Q.F32:
        return rows.astype(np.float32, copy=False)
    if qtype == Q.F16:
        return rows.astype(np.float16, copy=False)
    if qtype in GGML_QUANTIZED:
        # imported here: only these types need the built runtime library
        from ..quant import quantize as ggml_quantize
        return ggml_quantize(rows, GGML_QUANTIZED[qtype])
    return quantize(rows.astype(np.float32, copy=False), qtype)
