"""A structure-aware GGUF mutator and a crash-isolating runner for it.

The mutator parses a GGUF into header, key/values and tensors (each tensor with its data), changes
one thing the way a broken or hostile file would (header counts, key and string lengths, array
lengths and types, value types, tensor dims / types / offsets / names, general.alignment,
duplicated or missing keys, huge or non-finite values, truncation, flipped bytes) and writes it
back. Mutant i of a base file is a pure function of (base, seed, i), so a failure is reproduced
from its index alone.

The runner loads and, when that succeeds, runs every mutant in a worker subprocess (a memory
limit, a time limit per mutant): a worker killed by a signal or stuck past the limit is a failure,
its mutant saved; a worker that dies is restarted after the mutant that killed it. Used by
tests/test_fuzz_gguf.py (a few hundred mutants) and bench/fuzz_gguf.py (long runs).

    python tests/gguf_fuzz.py worker BASE KIND TARGET SEED START END   # internal: the worker
"""
from __future__ import annotations

import math
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parent.parent

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


def parse(buf: bytes) -> Gguf:
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF"
    pos = 24
    kvs = []
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen]
        pos += 8 + klen
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        n = _value_size(buf, pos, vtype)
        kvs.append(KV(key, vtype, buf[pos:pos + n]))
        pos += n
    infos = []
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", buf, pos)[0]
        name = buf[pos + 8:pos + 8 + nlen]
        pos += 8 + nlen
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


# ---- the worker -----------------------------------------------------------------------------------------

def _exercise(path: str, kind: str, target, index: int) -> str:
    """Load the mutant and, if it loads, generate a few tokens greedy and sampled."""
    from dspark_ggml.context import Context
    from dspark_ggml.draft import DraftContext, DraftModel
    from dspark_ggml.engine import Engine
    from dspark_ggml.gguf_file import GGUFFile
    from dspark_ggml.model import Model
    from dspark_ggml.sampling import SamplingParams

    with GGUFFile(path) as f:
        _ = f.metadata, list(f.tensors())
    use_mmap = index % 2 == 0
    sampled = SamplingParams(temperature=0.8, top_k=5, max_tokens=4, seed=index)
    if kind == "target":
        with Model(path, use_mmap=use_mmap) as m:
            prompt = [t % m.n_vocab for t in (1, 2, 3)]
            for sp in (SamplingParams(max_tokens=4), sampled):
                with Context(m, n_ctx=64, n_threads=1) as ctx:
                    Engine(ctx).generate(prompt, sp)
        return "ok"
    with DraftModel(path, target, use_mmap=use_mmap) as d:
        prompt = [t % target.n_vocab for t in (1, 2, 3)]
        for mode, sp in (("greedy", SamplingParams(max_tokens=4)), ("probabilistic", sampled)):
            with Context(target, n_ctx=64, n_threads=1) as ctx, DraftContext(d, n_ctx=64, n_threads=1) as dctx:
                Engine(ctx, dctx, draft_mode=mode).generate(prompt, sp)
    return "ok"


def worker(base: str, kind: str, target_path: str, seed: int, start: int, end: int) -> None:
    """Run mutants [start, end) of `base`, one "start i" / "end i outcome" line pair each."""
    sys.path.insert(0, str(ROOT))
    from dspark_ggml.errors import DSparkError
    from dspark_ggml.model import Model

    data = Path(base).read_bytes()
    target = Model(target_path) if kind == "draft" else None
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        for i in range(start, end):
            Path(path).write_bytes(mutate(data, seed, i))
            print(f"start {i}", flush=True)
            try:
                outcome = _exercise(path, kind, target, i)
            except DSparkError as e:
                outcome = f"refused {type(e).__name__}"
            except Exception as e:  # noqa: BLE001 - reported: a bad file should give a DSparkError
                outcome = f"pyerror {type(e).__name__}: {str(e)[:160]!r}"
            print(f"end {i} {outcome}", flush=True)
    finally:
        os.unlink(path)


# ---- the runner -------------------------------------------------------------------------------------------

@dataclass
class Base:
    path: Path
    kind: str                     # "target" or "draft"
    target: Path | None = None    # a draft's (good) target


@dataclass
class Report:
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)      # crashes and hangs: "base#i: what (saved as ...)"
    pyerrors: list[str] = field(default_factory=list)      # non-DSparkError exceptions
    n: int = 0

    def summary(self) -> str:
        lines = [f"{self.n} mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))]
        return "\n".join(lines + self.failures + self.pyerrors[:20])


def default_bases(directory: Path) -> list[Base]:
    """Tiny targets of each architecture and storage type, tiny drafts of each kind (written into
    `directory`), and the demo pair when it is installed."""
    from dspark_ggml.tiny import DraftConfig, TargetConfig, write_draft, write_target

    d = Path(directory)
    tcfg = TargetConfig(n_vocab=300, n_layer=2)
    write_target(d / "qwen3.gguf", tcfg, seed=1)
    write_target(d / "llama-q8_0.gguf", TargetConfig(arch="llama", dtype="q8_0", n_vocab=300), seed=2)
    write_target(d / "qwen2-f16.gguf", TargetConfig(arch="qwen2", dtype="f16", n_vocab=300, tied_embeddings=True),
                 seed=3)
    write_draft(d / "dspark.gguf", DraftConfig(), tcfg, seed=4)
    write_draft(d / "dflash.gguf", DraftConfig(kind="dflash", block_size=5), tcfg, seed=5)
    write_draft(d / "reduced.gguf", DraftConfig(draft_vocab=64, own_head=True, markov_head_type="gated"), tcfg, seed=6)
    out = [Base(d / "qwen3.gguf", "target"), Base(d / "llama-q8_0.gguf", "target"), Base(d / "qwen2-f16.gguf", "target")]
    out += [Base(d / name, "draft", d / "qwen3.gguf") for name in ("dspark.gguf", "dflash.gguf", "reduced.gguf")]
    demo = ROOT / "python" / "dspark_ggml" / "demo"
    if (demo / "target.gguf").is_file():
        out += [Base(demo / "target.gguf", "target"), Base(demo / "draft-dspark.gguf", "draft", demo / "target.gguf"),
                Base(demo / "draft-dspark-reduced.gguf", "draft", demo / "target.gguf")]
    return out


def _limit_memory(limit_bytes: int) -> None:
    import resource

    # AddressSanitizer reserves terabytes of address space for its shadow memory: no limit under it
    if limit_bytes and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    os.setsid()


def _save(base: Base, seed: int, i: int, out_dir: Path, what: str) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{base.path.stem}-seed{seed}-{i}.gguf"
    dst.write_bytes(mutate(base.path.read_bytes(), seed, i))
    return f"{base.path.name}#{i}: {what} (saved as {dst})"


def run(bases: list[Base], n_per_base: int, seed: int, out_dir: Path, timeout_s: float = 30.0,
        memory_limit: int = 4 << 30) -> Report:
    """Run mutants 0 .. n_per_base-1 of every base; crashes and hangs are saved under out_dir."""
    report = Report()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for base in bases:
        i = 0
        while i < n_per_base:
            cmd = [sys.executable, str(Path(__file__).resolve()), "worker", str(base.path), base.kind,
                   str(base.target or ""), str(seed), str(i), str(n_per_base)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                    preexec_fn=lambda: _limit_memory(memory_limit))
            current, i = _follow(proc, base, seed, i, out_dir, timeout_s, report)
            if current is None:
                break  # the worker ran to the end
            i = current + 1  # it died on mutant `current`: go on after it
    return report


def _follow(proc: subprocess.Popen, base: Base, seed: int, i: int, out_dir: Path, timeout_s: float,
            report: Report) -> tuple[int | None, int]:
    """Read a worker's lines until it exits; returns (the mutant it died on or None, next index)."""
    assert proc.stdout is not None
    current: int | None = None
    deadline = time.monotonic() + timeout_s + 30  # the first mutant also pays for the imports
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            report.outcomes["hang"] += 1
            report.n += 1
            report.failures.append(_save(base, seed, current if current is not None else i, out_dir,
                                         f"no answer within {timeout_s:.0f} s"))
            return (current if current is not None else i), i
        line = proc.stdout.readline()
        if not line:
            rc = proc.wait()
            if current is None:
                if rc != 0:
                    raise RuntimeError(f"the fuzz worker failed before any mutant (exit {rc})")
                return None, i
            report.outcomes["crash"] += 1
            report.n += 1
            what = f"killed by signal {-rc}" if rc < 0 else f"exited with {rc}"
            report.failures.append(_save(base, seed, current, out_dir, what))
            return current, i
        word, idx, *rest = line.split(" ", 2)
        if word == "start":
            current = int(idx)
            deadline = time.monotonic() + timeout_s
        elif word == "end":
            outcome = rest[0].strip() if rest else ""
            report.n += 1
            report.outcomes[outcome.split(":")[0]] += 1
            if outcome.startswith("pyerror"):
                report.pyerrors.append(f"{base.path.name}#{idx}: {outcome}")
            current, i = None, int(idx) + 1


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]))
    else:
        sys.exit(__doc__)
