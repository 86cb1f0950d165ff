"""Reading GGUF files through the C core: metadata with Python values and the tensor table."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from . import _lib
from ._handle import NativeHandle, int_property

# enum dspark_gguf_type -> numpy dtype of array elements
_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY, _BOOL = 8, 9, 7
_FLOATS = (6, 12)


def decode_gguf_string(raw: bytes) -> str:
    """GGUF strings are UTF-8; a vocabulary may hold pieces that are not (byte fragments): their
    bytes stay recoverable through surrogateescape."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="surrogateescape")


def _string_array(handle: Any, i: int, n: int) -> list[str]:
    # the hot loop of a vocabulary (150k entries): one C call and one decode per string
    get, string = _lib.lib().dspark_gguf_get_arr_str, _lib.ffi().string
    raw = [string(get(handle, i, j)) for j in range(n)]
    try:
        return [r.decode("utf-8") for r in raw]
    except UnicodeDecodeError:
        return [decode_gguf_string(r) for r in raw]


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF tensor table. ``shape`` is in ggml order (fastest dimension first)."""

    name: str
    type: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFFile(NativeHandle):
    """A GGUF file opened (and structurally validated) by the C core; reads no tensor data.

    Raises:
        FileAccessError: the file is missing or unreadable.
        FileFormatError: the file is not a valid GGUF (bad magic, truncated, malformed).
    """

    _free_function = "dspark_gguf_close"
    _kind = "GGUF file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._metadata: dict[str, Any] | None = None
        self._handle = _lib.check_ptr(_lib.lib().dspark_gguf_open(self.path.encode()))

    @classmethod
    def _borrow(cls, handle: Any, path: str) -> "GGUFFile":
        """Wrap a handle owned by someone else (a model): closing it frees nothing."""
        self = cls.__new__(cls)
        self._free_function = ""
        self.path, self._handle, self._metadata = path, handle, None
        return self

    def __enter__(self) -> "GGUFFile":
        return self

    file_size = int_property("dspark_gguf_file_size")
    version = int_property("dspark_gguf_version")

    @property
    def metadata(self) -> dict[str, Any]:
        """All key/value pairs; arrays of numbers come back as numpy arrays, strings as str."""
        if self._metadata is None:
            self._metadata = self.read_metadata()
        return self._metadata

    def read_metadata(self, prefix: str = "") -> dict[str, Any]:
        """The key/value pairs whose key starts with ``prefix``; the values of the others are not
        read (a tokenizer asks for "tokenizer." only)."""
        n = _lib.lib().dspark_gguf_n_kv(self.handle)
        keys = ((i, self._key(i)) for i in range(n))
        return {key: self._value(i) for i, key in keys if key.startswith(prefix)}

    def get(self, key: str, default: Any = None) -> Any:
        """One value, looked up by the core (the other values, a tokenizer's vocabulary among
        them, are not read)."""
        if self._metadata is not None:
            return self._metadata.get(key, default)
        i = _lib.lib().dspark_gguf_find_key(self.handle, key.encode())
        return default if i < 0 else self._value(i)

    def __contains__(self, key: str) -> bool:
        return _lib.lib().dspark_gguf_find_key(self.handle, key.encode()) >= 0

    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture")

    def tensor(self, name: str) -> TensorInfo | None:
        """The tensor table's entry for ``name``, or None."""
        i = _lib.lib().dspark_gguf_find_tensor(self.handle, name.encode())
        return None if i < 0 else self._tensor(i)

    def tensors(self) -> Iterator[TensorInfo]:
        for i in range(_lib.lib().dspark_gguf_n_tensors(self.handle)):
            yield self._tensor(i)

    def _tensor(self, i: int) -> TensorInfo:
        lib = _lib.lib()
        n_dims = lib.dspark_gguf_tensor_n_dims(self.handle, i)
        return TensorInfo(
            name=_lib.to_str(lib.dspark_gguf_tensor_name(self.handle, i)) or "",
            type=_lib.to_str(lib.dspark_gguf_tensor_type(self.handle, i)) or "",
            shape=tuple(int(lib.dspark_gguf_tensor_ne(self.handle, i, d)) for d in range(n_dims)),
            offset=int(lib.dspark_gguf_tensor_offset(self.handle, i)),
            nbytes=int(lib.dspark_gguf_tensor_nbytes(self.handle, i)),
        )

    # ---- values -------------------------------------------------------------------------------

    def _key(self, i: int) -> str:
        return decode_gguf_string(_lib.ffi().string(_lib.lib().dspark_gguf_key(self.handle, i)))

    def _value(self, i: int) -> Any:
        lib, ffi = _lib.lib(), _lib.ffi()
        t = lib.dspark_gguf_kv_type(self.handle, i)
        if t == _STRING:
            return decode_gguf_string(ffi.string(lib.dspark_gguf_get_str(self.handle, i)))
        if t == _ARRAY:
            return self._array(i)
        if t in _FLOATS:
            out = ffi.new("double *")
            _lib.check(lib.dspark_gguf_get_float(self.handle, i, out))
            return float(out[0])
        out = ffi.new("int64_t *")
        _lib.check(lib.dspark_gguf_get_int(self.handle, i, out))
        return bool(out[0]) if t == _BOOL else int(out[0])

    def _array(self, i: int) -> Any:
        lib, ffi = _lib.lib(), _lib.ffi()
        at = lib.dspark_gguf_arr_type(self.handle, i)
        n = lib.dspark_gguf_arr_n(self.handle, i)
        if at == _STRING:
            return _string_array(self.handle, i, n)
        dtype = _NUMPY_TYPES.get(at)
        if dtype is None:  # nested arrays: not used by any model we read
            return None
        ptr = lib.dspark_gguf_get_arr_data(self.handle, i)
        if n == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(ffi.buffer(ptr, n * np.dtype(dtype).itemsize), dtype=dtype).copy()
