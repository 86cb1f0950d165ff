"""What a verify costs on this CPU: the stream bandwidth, each type's bytes per decode step and the
share of the bandwidth a step reaches, and a k-row verify in decode steps for k = 1..16
(SmolLM2-135M, or Gemma-3-270M with --model gemma3; ours; with llama.cpp's llama-bench pp k / pp1
on the same files where it is built).

    python bench/bench_verify.py [--types q8_0 q4_0 Q4_1 ...] [--threads 2] [--repeats 3] [--k 1 2 4 9 16]
                                 [--no-llama-cpp] [--isa avx512_vnni ...]

`--isa` adds, under each type, the rows of this machine capped at lesser instruction sets
(DSPARK_CPU_ISA, each in a process of its own), e.g. the AMX tiles against AVX-512 VNNI alone;
`--plain` a row with the weights left in the plain layout (cpu_repack=False: the block types then
transposed on every call instead of packed at load).

One table per repeat (the machine is shared: read the rows next to each other, not across runs).
A step and a k-row batch are timed at ~100 cells of context, each the best of 5 tries; the cost of
a k-row verify is its time over one step's. llama-bench is bench/llama_cpp_build.py's build.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from common import add_model_arg, llama_bench, print_table, real_model_file
import llama_cpp_build

import dspark_ggml as dg
from dspark_ggml.quant import cpu_isa

TYPES = ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q6_K", "iq4_nl", "Q4_K_M"]


def stream_gbps(threads: int, mib: int = 1024) -> float:
    """GB/s of `threads` threads each summing its share of a buffer far larger than the caches."""
    a = np.ones(mib << 18, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(3):
        workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]  # reductions leave the GIL
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def verify_costs(path: Path, threads: int, ks: list[int], repack: bool = True) -> tuple[float, dict[int, float]]:
    """(decode step ms, {k: k-row batch time / step time}), each the best of 5 tries."""
    model = dg.Model(str(path), cpu_repack=repack)
    ctx = dg.Context(model, n_ctx=512, n_batch=128, n_threads=threads)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 40000, 96)]
    ctx.decode(prompt)
    for k in ks:  # every shape's graph built before any clock
        ctx.decode(prompt[:k], outputs=[True] * k)
        ctx.kv_seq_rm(0, len(prompt))
    step = float("inf")
    batch = {k: float("inf") for k in ks}
    for _ in range(5):
        t0 = time.perf_counter()
        for t in prompt[:8]:
            ctx.decode([t])
        step = min(step, (time.perf_counter() - t0) / 8)
        ctx.kv_seq_rm(0, len(prompt))
        for k in ks:
            t0 = time.perf_counter()
            ctx.decode(prompt[:k], outputs=[True] * k)
            batch[k] = min(batch[k], time.perf_counter() - t0)
            ctx.kv_seq_rm(0, len(prompt))
    ctx.close()
    model.close()
    return step * 1e3, {k: batch[k] / step for k in ks}


def llama_cpp_costs(exe: Path, path: Path, threads: int, ks: list[int]) -> dict[int, float]:
    """llama-bench's pp k time over its pp1 time (the same ratio as ours)."""
    pp1, _ = llama_bench(exe, path, threads, 1, 0, reps=5)
    return {k: (k / llama_bench(exe, path, threads, k, 0, reps=5)[0]) * pp1 for k in ks}


def costs_under(isa: str | None, path: Path, threads: int, ks: list[int]) -> tuple[float, dict[int, float]]:
    """verify_costs in this process (isa None) or in a child capped at `isa` (DSPARK_CPU_ISA)."""
    if isa is None:
        return verify_costs(path, threads, ks)
    cmd = [sys.executable, __file__, "--one", str(path), "--threads", str(threads), "--k", *map(str, ks)]
    out = subprocess.run(cmd, env=dict(os.environ, DSPARK_CPU_ISA=isa), capture_output=True, text=True, check=True)
    step, cost = json.loads(out.stdout.strip().splitlines()[-1])
    return step, {int(k): v for k, v in cost.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arg(ap)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", nargs="+", type=int, default=[1, 2, 4, 8, 9, 12, 16])
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--isa", nargs="+", default=None,
                    help="also rows for these capped instruction sets (DSPARK_CPU_ISA), e.g. avx512_vnni")
    ap.add_argument("--plain", action="store_true", help="also a row with the weights in the plain layout")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child of --isa: one file's costs as JSON
    args = ap.parse_args()
    if args.one:
        print(json.dumps(verify_costs(args.one, args.threads, args.k)))
        return
    exe = None if args.no_llama_cpp else llama_cpp_build.program("llama-bench")
    gbps = stream_gbps(args.threads)
    print(f"CPU kernels: {cpu_isa()}; stream read, {args.threads} threads: {gbps:.1f} GB/s"
          f"{'' if exe else '; llama-bench not built (bench/llama_cpp_build.py --targets llama-bench)'}")
    files = {t: real_model_file(args.model, t) for t in args.types}
    theirs = {t: llama_cpp_costs(exe, files[t], args.threads, args.k) for t in args.types} if exe else {}
    for rep in range(args.repeats):
        rows = []
        for t in args.types:
            path = files[t]
            for isa in [None] + (args.isa or []) + (["plain"] if args.plain else []):
                if isa == "plain":
                    step, cost = verify_costs(path, args.threads, args.k, repack=False)
                else:
                    step, cost = costs_under(isa, path, args.threads, args.k)
                mb = os.path.getsize(path) / 1e6
                row = [t, isa if isa and isa != "plain" else cpu_isa() + (", plain" if isa else ""), f"{mb:.0f}", f"{step:.2f}", f"{mb / step:.1f}", f"{mb / step / gbps:.0%}"]
                row += [f"{cost[k]:.2f}" + (f" / {theirs[t][k]:.2f}" if t in theirs and isa is None else "") for k in args.k]
                rows.append(row)
        print(f"\nrun {rep + 1} of {args.repeats}: a k-row verify in decode steps" + (" (ours / llama-bench)" if theirs else ""))
        print_table(["type", "kernels", "MB/step", "step ms", "GB/s", "of stream"] + [f"k={k}" for k in args.k], rows)


if __name__ == "__main__":
    main()
