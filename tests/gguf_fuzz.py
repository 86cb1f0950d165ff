"""Fuzzing the loader with mutated GGUFs (tests/gguf_mutate.py), crash-isolated: every mutant is
loaded and, when that succeeds, run in a worker subprocess (a memory limit, a time limit per
mutant). A worker killed by a signal or stuck past the limit is a failure, its mutant saved; a
worker that dies is restarted after the mutant that killed it. Used by tests/test_fuzz_gguf.py (a
few hundred mutants) and tools/fuzz_gguf.py (long runs).

    python tests/gguf_fuzz.py worker BASE KIND TARGET SEED START END   # internal: the worker
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the worker runs this file as a script
    sys.path.insert(0, str(ROOT))

from tests.gguf_mutate import mutate  # noqa: E402

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
    `directory`), and the tiny pair."""
    from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target

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
    demo = ROOT / "tests" / "data" / "tiny_pair"
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
