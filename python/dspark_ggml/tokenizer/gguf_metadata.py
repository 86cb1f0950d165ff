"""Fast reader for the key/value metadata section of a GGUF file.

`gguf.GGUFReader` builds a numpy view for every part of every array element, which takes
~16 s for a 150k-token vocabulary (two string arrays of ~150k entries each). The tokenizer
needs only the key/value section, so this module walks it directly with `struct` over a
memory map: ~0.2 s for the same file. Tensor infos and data are never touched.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from .errors import TokenizerError

_MAGIC = b"GGUF"

# GGUF value type codes (the file format's numbering, same as gguf.GGUFValueType).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = 8, 9, 10, 11, 12

_SCALAR_FORMATS: dict[int, str] = {
    _UINT8: "B", _INT8: "b", _UINT16: "H", _INT16: "h", _UINT32: "I", _INT32: "i",
    _FLOAT32: "f", _BOOL: "?", _UINT64: "Q", _INT64: "q", _FLOAT64: "d",
}


def decode_gguf_string(raw: bytes) -> str:
    """GGUF strings are UTF-8; keep undecodable bytes recoverable via surrogateescape."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="surrogateescape")


class _Cursor:
    """Sequential little- or big-endian reads from a buffer."""

    def __init__(self, buf: Any, endian: str) -> None:
        self.buf = buf
        self.pos = 0
        self.endian = endian

    def scalar(self, fmt: str) -> Any:
        st = struct.Struct(self.endian + fmt)
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return value

    def string_bytes(self) -> bytes:
        n = self.scalar("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise TokenizerError("GGUF metadata is truncated (a string runs past the end of the file)")
        raw = bytes(self.buf[self.pos:end])
        self.pos = end
        return raw

    def string_array(self, n: int, keep: bool) -> list[str] | None:
        # The hot loop for vocabularies: one unpack_from and one slice per string, then one
        # decode pass (a bytes slice of an mmap is already a bytes object).
        buf, pos = self.buf, self.pos
        unpack_len = struct.Struct(self.endian + "Q").unpack_from
        raw: list[bytes] = []
        append = raw.append
        for _ in range(n):
            (length,) = unpack_len(buf, pos)
            pos += 8
            if keep:
                append(buf[pos:pos + length])
            pos += length
        if pos > len(buf):
            raise TokenizerError("GGUF metadata is truncated (a string array runs past the end of the file)")
        self.pos = pos
        if not keep:
            return None
        try:
            return [r.decode("utf-8") for r in raw]
        except UnicodeDecodeError:
            return [decode_gguf_string(bytes(r)) for r in raw]

    def scalar_array(self, elem_type: int, n: int, keep: bool) -> list[Any] | None:
        fmt = _SCALAR_FORMATS[elem_type]
        st = struct.Struct(f"{self.endian}{n}{fmt}")
        out = list(st.unpack_from(self.buf, self.pos)) if keep else None
        self.pos += st.size
        return out


def _read_value(cur: _Cursor, vtype: int, keep: bool) -> Any:
    if vtype in _SCALAR_FORMATS:
        return cur.scalar(_SCALAR_FORMATS[vtype])
    if vtype == _STRING:
        return decode_gguf_string(cur.string_bytes())
    if vtype == _ARRAY:
        elem_type = cur.scalar("I")
        n = cur.scalar("Q")
        if elem_type == _STRING:
            return cur.string_array(n, keep)
        if elem_type in _SCALAR_FORMATS:
            return cur.scalar_array(elem_type, n, keep)
        if elem_type == _ARRAY:
            return [_read_value(cur, _ARRAY, keep) for _ in range(n)]
        raise TokenizerError(f"GGUF metadata has an array of unknown value type {elem_type}")
    raise TokenizerError(f"GGUF metadata has a value of unknown type {vtype}")


def _endianness(buf: Any) -> str:
    # A GGUF written on a big-endian host has the version word byte-swapped; valid versions are small.
    (version,) = struct.unpack_from("<I", buf, 4)
    if version in (2, 3):
        return "<"
    (version_be,) = struct.unpack_from(">I", buf, 4)
    if version_be in (2, 3):
        return ">"
    raise TokenizerError(f"unsupported GGUF version {version} (this reader handles versions 2 and 3)")


def parse_gguf_metadata(buf: Any, prefix: str = "") -> dict[str, Any]:
    """Parse the key/value section of GGUF bytes `buf` (bytes, mmap or memoryview).

    Only keys starting with `prefix` (default "": all) are returned; others are skipped
    without decoding their values. Strings become `str`, arrays become lists.
    """
    if len(buf) < 24 or bytes(buf[:4]) != _MAGIC:
        raise TokenizerError("not a GGUF file (bad magic)")
    cur = _Cursor(buf, _endianness(buf))
    cur.pos = 8
    cur.scalar("Q")  # tensor count: not needed
    n_kv = cur.scalar("Q")
    meta: dict[str, Any] = {}
    try:
        for _ in range(n_kv):
            key = decode_gguf_string(cur.string_bytes())
            vtype = cur.scalar("I")
            keep = key.startswith(prefix)
            value = _read_value(cur, vtype, keep)
            if keep:
                meta[key] = value
    except struct.error as exc:
        raise TokenizerError(f"GGUF metadata is truncated or corrupt: {exc}") from exc
    return meta


def read_gguf_metadata(path: str | os.PathLike[str], prefix: str = "") -> dict[str, Any]:
    """Read the key/value metadata of the GGUF file at `path` (keys filtered by `prefix`)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise TokenizerError(f"{os.fspath(path)!r} is not a GGUF file (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return parse_gguf_metadata(mm, prefix)
            except TokenizerError as exc:
                raise TokenizerError(f"{os.fspath(path)!r}: {exc}") from exc
