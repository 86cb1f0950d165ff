"""A structure-aware GGUF mutator: parses a GGUF into header, key/values and tensors (each tensor
with its data), changes one thing the way a broken or hostile file would (header counts, key and
string lengths, array lengths and types, value types, tensor dims / types / offsets / names,
general.alignment, duplicated or missing keys, huge or non-finite values and data, truncation,
flipped bytes) and writes it back. Mutant i of a base file is a pure function of (base, seed, i),
so a failure is reproduced from its index alone. Run by tests/gguf_fuzz.py."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace

import numpy as np
from gguf.constants import GGML_QUANT_SIZES

# ---- the format -------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
           U64: "<Q", I64: "<q", F64: "<d"}
_INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
# ggml type id -> (block size, bytes per block), as gguf-py knows them
_GGML_SIZES = {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()}


@dataclass
class KV:
    key: bytes
    vtype: int
    raw: bytes  # the serialized value, without its type field


@dataclass
class Tensor:
    name: bytes
    dims: list[int]
    ttype: int
    data: bytes


@dataclass
class Gguf:
    version: int
    kvs: list[KV]
    tensors: list[Tensor]

    @property
    def alignment(self) -> int:
        for kv in self.kvs:
            if kv.key == b"general.alignment" and kv.vtype == U32:
                a = struct.unpack("<I", kv.raw)[0]
                if a > 0 and a & (a - 1) == 0:
                    return a
        return 32


def _value_size(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _SCALAR:
        return struct.calcsize(_SCALAR[vtype])
    if vtype == STRING:
        return 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == ARRAY:
        atype, n = struct.unpack_from("<IQ", buf, pos)
        p = pos + 12
        for _ in range(n):
            p += _value_size(buf, p, atype)
        return p - pos
    raise ValueError(f"value type {vtype}")


def tensor_nbytes(dims: list[int], ttype: int) -> int:
    block, size = _GGML_SIZES[ttype]
    return math.prod(dims) // block * size


def _string(buf: bytes, pos: int) -> tuple[bytes, int]:
    """A GGUF string (u64 length, bytes) at ``pos``, and the position after it."""
    n = struct.unpack_from("<Q", buf, pos)[0]
    return buf[pos + 8:pos + 8 + n], pos + 8 + n


def parse(buf: bytes) -> Gguf:
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF"
    pos = 24
    kvs = []
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        n = _value_size(buf, pos, vtype)
        kvs.append(KV(key, vtype, buf[pos:pos + n]))
        pos += n
    infos = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        n_dims = struct.unpack_from("<I", buf, pos)[0]
        dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
        pos += 4 + 8 * n_dims
        ttype, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, dims, ttype, offset))
    g = Gguf(version, kvs, [])
    data0 = -(-pos // g.alignment) * g.alignment
    for name, dims, ttype, offset in infos:
        start = data0 + offset
        g.tensors.append(Tensor(name, dims, ttype, buf[start:start + tensor_nbytes(dims, ttype)]))
    return g


@dataclass
class Field:
    """A numeric field of the serialized file: where it is and what it is (for lying about it)."""

    offset: int
    fmt: str
    kind: str


def serialize(g: Gguf, data_alignment: int | None = None) -> tuple[bytes, list[Field]]:
    """The file, and its numeric structural fields. The data is padded to `data_alignment`
    (default: the file's own general.alignment, or 32)."""
    align = data_alignment or g.alignment
    out = bytearray()
    fields: list[Field] = []

    def put(fmt: str, value: object, kind: str | None = None) -> None:
        if kind:
            fields.append(Field(len(out), fmt, kind))
        out.extend(struct.pack(fmt, value))

    put("<4s", b"GGUF")
    put("<I", g.version, "version")
    put("<Q", len(g.tensors), "n_tensors")
    put("<Q", len(g.kvs), "n_kv")
    for kv in g.kvs:
        put("<Q", len(kv.key), "key_length")
        out.extend(kv.key)
        put("<I", kv.vtype, "value_type")
        if kv.vtype == STRING:
            fields.append(Field(len(out), "<Q", "string_length"))
        elif kv.vtype == ARRAY:
            fields.append(Field(len(out), "<I", "array_type"))
            fields.append(Field(len(out) + 4, "<Q", "array_length"))
        out.extend(kv.raw)
    offsets, end = [], 0
    for t in g.tensors:
        offsets.append(end)
        end += -(-len(t.data) // align) * align
    for t, off in zip(g.tensors, offsets):
        put("<Q", len(t.name), "tensor_name_length")
        out.extend(t.name)
        put("<I", len(t.dims), "n_dims")
        for d in t.dims:
            put("<Q", d, "dim")
        put("<I", t.ttype, "tensor_type")
        put("<Q", off, "tensor_offset")
    out.extend(bytes(-len(out) % align))
    for t in g.tensors:
        out.extend(t.data)
        out.extend(bytes(-len(t.data) % align))
    return bytes(out), fields


# ---- mutations ------------------------------------------------------------------------------------

_INTERESTING_INTS = [0, 1, 2, 3, -1, -2, 7, 8, 16, 31, 32, 33, 63, 64, 255, 256, 4096, 65535, 65536,
                     2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 4, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
_INTERESTING_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, -1e-6, 1e-30, 1e30, 3.4e38, 1e300]


def _fit(value: int, fmt: str) -> int:
    bits = struct.calcsize(fmt) * 8
    value %= 2**bits
    if fmt[-1].islower():  # signed
        value = value - 2**bits if value >= 2**(bits - 1) else value
    return value


def _lie_about_a_field(rng: np.random.Generator, buf: bytes, fields: list[Field]) -> bytes:
    f = fields[rng.integers(len(fields))]
    old = struct.unpack_from(f.fmt, buf, f.offset)[0]
    choice = rng.integers(4)
    if choice == 0:
        new = old + int(rng.choice([-2, -1, 1, 2, 8, 32]))
    elif choice == 1:
        new = int(rng.choice(_INTERESTING_INTS))
    elif choice == 2:
        new = old * int(rng.choice([2, 16, 1024]))
    else:
        new = int(rng.integers(0, 2**31))
    out = bytearray(buf)
    struct.pack_into(f.fmt, out, f.offset, _fit(new, f.fmt))
    return bytes(out)


def _pack_float(fmt: str, value: float) -> bytes:
    with np.errstate(over="ignore"):  # 1e300 as f32 is inf, as a writer would store it
        return (np.float32(value) if fmt == "<f" else np.float64(value)).tobytes()


def _set_scalar(kv: KV, value: object) -> KV:
    fmt = _SCALAR[kv.vtype]
    if kv.vtype in (F32, F64):
        return replace(kv, raw=_pack_float(fmt, float(value)))
    return replace(kv, raw=struct.pack(fmt, _fit(int(value), fmt)))


def _mutate_value(rng: np.random.Generator, g: Gguf) -> None:
    scalars = [i for i, kv in enumerate(g.kvs) if kv.vtype in _SCALAR]
    arrays = [i for i, kv in enumerate(g.kvs) if kv.vtype == ARRAY and struct.unpack_from("<I", kv.raw)[0] in _SCALAR]
    if arrays and rng.random() < 0.3:
        i = int(rng.choice(arrays))
        atype, n = struct.unpack_from("<IQ", g.kvs[i].raw)
        if n:
            fmt = _SCALAR[atype]
            raw = bytearray(g.kvs[i].raw)
            j = 12 + int(rng.integers(n)) * struct.calcsize(fmt)
            n_bytes = struct.calcsize(fmt)
            if atype in (F32, F64):
                raw[j:j + n_bytes] = _pack_float(fmt, float(rng.choice(_INTERESTING_FLOATS)))
            else:
                struct.pack_into(fmt, raw, j, _fit(int(rng.choice(_INTERESTING_INTS)), fmt))
            g.kvs[i] = replace(g.kvs[i], raw=bytes(raw))
        return
    if not scalars:
        return
    i = int(rng.choice(scalars))
    if g.kvs[i].vtype in (F32, F64):
        g.kvs[i] = _set_scalar(g.kvs[i], rng.choice(_INTERESTING_FLOATS))
    else:
        g.kvs[i] = _set_scalar(g.kvs[i], rng.choice(_INTERESTING_INTS))


def _mutate_alignment(rng: np.random.Generator, g: Gguf) -> int | None:
    """Insert or replace general.alignment; returns the padding the data is written with."""
    g.kvs = [kv for kv in g.kvs if kv.key != b"general.alignment"]
    value = int(rng.choice([0, 1, 2, 3, 8, 16, 24, 31, 33, 64, 128, 4096, 2**31]))
    if rng.random() < 0.15:
        g.kvs.insert(int(rng.integers(len(g.kvs) + 1)), KV(b"general.alignment", STRING, struct.pack("<Q", 2) + b"16"))
        return None
    g.kvs.insert(int(rng.integers(len(g.kvs) + 1)), KV(b"general.alignment", U32, struct.pack("<I", value)))
    valid = value > 0 and value & (value - 1) == 0 and value <= 4096
    # the data is padded to the stated alignment (a consistent file) or, now and then, to 32
    return value if valid and rng.random() < 0.7 else 32


def _retype_tensor(rng: np.random.Generator, g: Gguf) -> None:
    t = g.tensors[rng.integers(len(g.tensors))]
    same = [k for k in _GGML_SIZES if k != t.ttype and t.dims and t.dims[0] % _GGML_SIZES[k][0] == 0
            and tensor_nbytes(t.dims, k) == len(t.data)]
    if same and rng.random() < 0.8:
        t.ttype = int(rng.choice(same))  # the data still fits: only the type lies
    else:
        t.ttype = int(rng.choice(list(_GGML_SIZES) + [4, 5, 31, 40, 41, 99, 2**31]))


def _reshape_tensor(rng: np.random.Generator, g: Gguf) -> None:
    t = g.tensors[rng.integers(len(g.tensors))]
    choice = rng.integers(4)
    if choice == 0 and len(t.dims) > 1:
        t.dims = t.dims[::-1]
    elif choice == 1:
        t.dims = t.dims + [1]
    elif choice == 2 and len(t.dims) > 1:
        t.dims = [t.dims[0] * t.dims[1]] + t.dims[2:]
    else:
        t.dims = [int(rng.choice([0, 1, 2, 32, 2**20]))] + t.dims[1:]


def _mutate_data(rng: np.random.Generator, g: Gguf) -> None:
    t = g.tensors[rng.integers(len(g.tensors))]
    if t.ttype == 0 and t.data:
        a = np.frombuffer(t.data, dtype=np.float32).copy()
        a[rng.integers(len(a), size=max(1, len(a) // 4))] = rng.choice([np.nan, np.inf, -np.inf, 1e30])
        t.data = a.tobytes()
    elif t.ttype in (26, 27) and t.data:  # i32 / i64 ids (d2t): out of range
        a = np.frombuffer(t.data, dtype=np.int32 if t.ttype == 26 else np.int64).copy()
        a[rng.integers(len(a))] = rng.choice([-1, 2**31 - 1, len(a) * 1000])
        t.data = a.tobytes()


def _mutate_keys(rng: np.random.Generator, g: Gguf) -> None:
    i = int(rng.integers(len(g.kvs)))
    choice = rng.integers(4)
    if choice == 0:
        g.kvs.insert(int(rng.integers(len(g.kvs) + 1)), replace(g.kvs[i]))  # duplicated key
    elif choice == 1:
        del g.kvs[i]
    elif choice == 2:
        g.kvs[i] = replace(g.kvs[i], key=g.kvs[i].key + b"\xff")
    else:
        t = g.tensors[rng.integers(len(g.tensors))]
        t.name = g.tensors[rng.integers(len(g.tensors))].name if rng.random() < 0.5 else t.name[:-1]


def _retype_value(rng: np.random.Generator, g: Gguf) -> None:
    i = int(rng.integers(len(g.kvs)))
    kv = g.kvs[i]
    if kv.vtype == ARRAY and rng.random() < 0.5:
        raw = bytearray(kv.raw)
        struct.pack_into("<I", raw, 0, int(rng.choice([U8, I32, F32, BOOL, STRING, ARRAY, U64, 13, 255])))
        g.kvs[i] = replace(kv, raw=bytes(raw))
    else:
        g.kvs[i] = replace(kv, vtype=int(rng.choice([U8, I32, F32, BOOL, STRING, U64, F64, 13, 2**31])))


def mutate(base: bytes, seed: int, index: int) -> bytes:
    """Mutant `index` of the GGUF bytes `base` (deterministic in base, seed and index)."""
    rng = np.random.default_rng([seed, index])
    g = parse(base)
    kind = int(rng.integers(11))
    align = None
    if kind == 0:
        _mutate_value(rng, g)
    elif kind == 1:
        align = _mutate_alignment(rng, g)
    elif kind == 2:
        _retype_tensor(rng, g)
    elif kind == 3:
        _reshape_tensor(rng, g)
    elif kind == 4:
        _mutate_data(rng, g)
    elif kind == 5:
        _mutate_keys(rng, g)
    elif kind == 6:
        _retype_value(rng, g)
    buf, fields = serialize(g, align)
    if kind in (7, 8):
        buf = _lie_about_a_field(rng, buf, fields)
    elif kind == 9:
        buf = buf[:int(rng.integers(4, len(buf)))]
    elif kind == 10:
        header_end = fields[-1].offset + 8
        out = bytearray(buf)
        for _ in range(int(rng.integers(1, 8))):
            out[int(rng.integers(4, header_end))] ^= 1 << int(rng.integers(8))
        buf = bytes(out)
    return buf
