"""Weight (de)quantization with ggml's own kernels: every type the runtime reads, K-quants included."""
from __future__ import annotations

import numpy as np

from . import _lib
from .errors import InvalidArgumentError


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """Quantize the rows of a float array (last axis = row) to ``type_name`` ("q4_k", "q8_0", ...).

    Returns the raw bytes as a uint8 array of shape [..., row bytes], the layout a GGUF stores.
    """
    a = np.ascontiguousarray(values, dtype=np.float32)
    n_per_row = a.shape[-1]
    n_rows = a.size // n_per_row if n_per_row else 0
    lib, ffi = _lib.lib(), _lib.ffi()
    size = _lib.check(lib.dspark_quant_size(type_name.encode(), n_rows, n_per_row))
    out = np.empty(size, dtype=np.uint8)
    _lib.check(lib.dspark_quantize(type_name.encode(), ffi.from_buffer("float[]", a),
                                   ffi.from_buffer("uint8_t[]", out), n_rows, n_per_row))
    return out.reshape(*a.shape[:-1], size // max(n_rows, 1))


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of quantized bytes, reshaped to ``shape`` (last axis = row).

    The core refuses a ``data`` buffer too short for ``shape`` and types with no float
    conversion (integers, f64)."""
    if any(int(d) < 0 for d in shape):
        raise InvalidArgumentError(f"dequantize: shape {tuple(shape)} has a negative dimension")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.float32)
    lib, ffi = _lib.lib(), _lib.ffi()
    _lib.check(lib.dspark_dequantize(type_name.encode(), ffi.from_buffer("uint8_t[]", raw), raw.size,
                                     ffi.from_buffer("float[]", out), n))
    return out.reshape(shape)


def cpu_matmul(weight: np.ndarray, type_name: str, n_per_row: int, x: np.ndarray, *, route: str = "auto",
               threads: int = 1) -> tuple[np.ndarray, str]:
    """``weight · x`` on the CPU as the runtime computes it: ``weight`` the bytes of quantized rows
    (:func:`quantize`'s output, [rows, row bytes]), ``x`` [columns, n_per_row] float32. Returns the
    result [columns, rows] and the route taken. ``route``: "auto" (the runtime's plan), "blocks",
    "own", "rows" or "ggml"; a route this CPU cannot run raises :class:`UnsupportedError`."""
    w = np.ascontiguousarray(weight).view(np.uint8).reshape(-1)
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] != n_per_row:
        raise InvalidArgumentError(f"cpu_matmul: x must be [columns, {n_per_row}], got {a.shape}")
    n_rows = int(weight.shape[0]) if weight.ndim == 2 else 1
    out = np.empty((a.shape[0], n_rows), dtype=np.float32)
    lib, ffi = _lib.lib(), _lib.ffi()
    taken = ffi.new("char[16]")
    _lib.check(lib.dspark_cpu_matmul(type_name.encode(), ffi.from_buffer("uint8_t[]", w), w.size, n_rows, n_per_row,
                                     ffi.from_buffer("float[]", a), a.shape[0], ffi.from_buffer("float[]", out),
                                     route.encode(), threads, taken))
    return out, ffi.string(taken).decode()


def cpu_isa() -> str:
    """The vector instructions the runtime's CPU kernels use here: "scalar", "avx2", "avx512_vnni" or
    "amx_int8" (AVX-512 VNNI and the AMX tiles, granted by the OS)."""
    return _lib.ffi().string(_lib.lib().dspark_cpu_isa()).decode()
