"""Streaming access to the tensors of a Hugging Face safetensors checkpoint.

Only the JSON headers are read up front; tensor data is read on demand, a block of rows at a time,
with plain file reads (no mmap), so the resident memory while converting stays near the size of
the chunk being processed instead of the size of the checkpoint. bf16 has no numpy dtype: it is
read as uint16 and widened to float32 exactly (a bf16 value is the top half of a float32).
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConversionError

# safetensors dtype name -> numpy dtype used to hold the raw bytes
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
INT_DTYPES = frozenset({"I64", "I32", "I16", "I8", "U8"})

# a header larger than this is not a safetensors header (guards against reading garbage)
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live; `shape` is in PyTorch (row-major, outermost first) order."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def n_rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_elements(self) -> int:
        return math.prod(self.shape[1:])

    def describe(self) -> str:
        return f"{self.name} ({self.dtype}, shape {list(self.shape)}, in {self.path.name})"


def _parse_header(path: Path) -> list[TensorRef]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise ConversionError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise ConversionError(f"{path}: bad safetensors header length {header_len}")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConversionError(f"{path}: unreadable safetensors header ({e})") from None
    data_start = 8 + header_len
    refs = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        refs.append(_tensor_ref(path, name, meta, data_start, size))
    return refs


def _tensor_ref(path: Path, name: str, meta: dict, data_start: int, file_size: int) -> TensorRef:
    dtype = meta.get("dtype")
    if dtype not in _STORAGE_DTYPES:
        raise ConversionError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    shape = tuple(int(d) for d in meta["shape"])
    begin, end = (int(x) for x in meta["data_offsets"])
    expected = math.prod(shape) * _STORAGE_DTYPES[dtype].itemsize
    if end - begin != expected or begin < 0 or data_start + end > file_size:
        raise ConversionError(f"{path}: tensor {name!r} has inconsistent data offsets "
                              f"{[begin, end]} for {dtype} {list(shape)} (file truncated?)")
    return TensorRef(name, dtype, shape, path, data_start + begin, end - begin)


def _shard_paths(model_dir: Path) -> list[Path]:
    index_file = model_dir / "model.safetensors.index.json"
    if index_file.is_file():
        index = json.loads(index_file.read_text(encoding="utf-8"))
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConversionError(f"{index_file}: no usable 'weight_map'")
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    shards = sorted(p for p in model_dir.glob("model*.safetensors"))
    if shards:
        return shards
    if any(model_dir.glob("pytorch_model*.bin")):
        raise ConversionError(f"{model_dir}: only a pytorch_model.bin checkpoint was found; the "
                              "converter reads safetensors only (re-save the model with "
                              "save_pretrained(..., safe_serialization=True))")
    raise ConversionError(f"{model_dir}: no model*.safetensors files found")


class Checkpoint(Mapping[str, TensorRef]):
    """All tensors of a checkpoint directory (single file or sharded with an index).

    Iteration order is the one llama.cpp's converter uses: shard files in name order, tensors
    sorted by name within each shard.
    """

    def __init__(self, model_dir: Path | str):
        self.model_dir = Path(model_dir)
        self._refs: dict[str, TensorRef] = {}
        for shard in _shard_paths(self.model_dir):
            if not shard.is_file():
                raise ConversionError(f"{shard}: listed in the index but missing")
            for ref in sorted(_parse_header(shard), key=lambda r: r.name):
                if ref.name in self._refs:
                    raise ConversionError(f"{self.model_dir}: tensor {ref.name!r} is stored twice")
                self._refs[ref.name] = ref
        self._check_index()

    def _check_index(self) -> None:
        index_file = self.model_dir / "model.safetensors.index.json"
        if not index_file.is_file():
            return
        listed = set(json.loads(index_file.read_text(encoding="utf-8"))["weight_map"])
        if listed != set(self._refs):
            missing = sorted(listed - set(self._refs))[:5]
            extra = sorted(set(self._refs) - listed)[:5]
            raise ConversionError(f"{index_file}: index and shards disagree (missing from shards: "
                                  f"{missing}, not in index: {extra})")

    def __getitem__(self, name: str) -> TensorRef:
        return self._refs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def _decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        widened = raw.astype(np.uint32)
        widened <<= 16  # in place: one f32-sized buffer per block, not two
        return widened.view(np.float32)
    return raw


def read_rows(ref: TensorRef, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) along the first dimension; bf16 comes back as float32, others as stored.

    0-d tensors are treated as one row."""
    storage = _STORAGE_DTYPES[ref.dtype]
    row_bytes = ref.row_elements * storage.itemsize
    count = (stop - start) * ref.row_elements
    raw = np.empty(count, dtype=storage)
    with open(ref.path, "rb") as f:
        f.seek(ref.offset + start * row_bytes)
        got = f.readinto(memoryview(raw).cast("B"))
    if got != raw.nbytes:
        raise ConversionError(f"{ref.describe()}: file ended early")
    rows_shape = (stop - start, *ref.shape[1:]) if ref.shape else ()
    return _decode(raw, ref.dtype).reshape(rows_shape)


def read_tensor(ref: TensorRef) -> np.ndarray:
    return read_rows(ref, 0, ref.n_rows)


def iter_row_blocks(ref: TensorRef, max_bytes: int) -> Iterator[np.ndarray]:
    """The tensor as consecutive blocks of whole rows, each about `max_bytes` once widened to f32."""
    rows_per_block = max(1, max_bytes // max(1, ref.row_elements * 4))
    for start in range(0, ref.n_rows, rows_per_block):
        yield read_rows(ref, start, min(ref.n_rows, start + rows_per_block))


def tensors_equal(a: TensorRef, b: TensorRef, max_bytes: int = 64 << 20) -> bool:
    """Exact value equality (after widening to float32), read block by block."""
    if a.shape != b.shape:
        return False
    for block_a, block_b in zip(iter_row_blocks(a, max_bytes), iter_row_blocks(b, max_bytes)):
        if not np.array_equal(block_a.astype(np.float32, copy=False),
                              block_b.astype(np.float32, copy=False)):
            return False
    return True
