"""Prompt processing on this CPU: SmolLM2-135M (or Gemma-3-270M with --model gemma3) in each weight
type, a prompt of --tokens tokens in one batch, ours next to llama.cpp's `llama-bench -p N` on the
same file.

    python bench/bench_prefill.py [--types f16 bf16 q8_0 q4_0 Q4_K_M] [--tokens 512] [--threads 2] [--repeats 2]

Ours: Context.decode of random tokens (only the last row's logits), the best of 4 tries on an
emptied cache. llama-bench: its mean over 3 repetitions (bench/llama_cpp_build.py's build, which
leaves AMX out; see there). One table per repeat, the ratio ours / llama-bench per row.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from common import add_model_arg, llama_bench, print_table, real_model_file
import llama_cpp_build

import dspark_ggml as dg
from dspark_ggml.quant import cpu_isa

TYPES = ["f16", "bf16", "q8_0", "q4_0", "Q4_K_M"]


def our_prefill(path, n_tokens: int, threads: int, tries: int = 4) -> float:
    """Prompt tokens/s: the best of `tries` prefills of n_tokens random tokens."""
    model = dg.Model(str(path))
    ctx = dg.Context(model, n_ctx=n_tokens + 16, n_batch=n_tokens, n_threads=threads)
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 40000, n_tokens)]
    best = float("inf")
    for _ in range(tries):
        ctx.kv_seq_rm(0, 0)
        t0 = time.perf_counter()
        ctx.decode(tokens, outputs=[False] * (n_tokens - 1) + [True])
        best = min(best, time.perf_counter() - t0)
    ctx.close()
    model.close()
    return n_tokens / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arg(ap)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    exe = llama_cpp_build.program("llama-bench")
    print(f"CPU kernels: {cpu_isa()}; pp{args.tokens}, {args.threads} threads")
    for rep in range(args.repeats):
        rows = []
        for t in args.types:
            path = real_model_file(args.model, t)
            ours = our_prefill(path, args.tokens, args.threads)
            theirs = llama_bench(exe, path, args.threads, args.tokens, 0, reps=3)[0] if exe else 0.0
            rows.append([t, f"{ours:.0f}", f"{theirs:.0f}" if exe else "-", f"{ours / theirs:.2f}" if exe else "-"])
        print(f"\nrun {rep + 1} of {args.repeats}: prompt tokens/s")
        print_table(["type", "ours", "llama-bench", "ours / llama-bench"], rows)


if __name__ == "__main__":
    main()
