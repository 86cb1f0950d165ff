"""Target decoding speed: prompt processing (pp) and token generation (tg) tokens/s.

    python bench/bench_target.py [--threads 2] [--dtypes f16 q8_0] [--llama-bench PATH]

Default model: a random Qwen3 with Qwen3-0.6B's shape (151936 vocab, hidden 1024, 28 layers,
tied embeddings; ~0.6B parameters), written once into bench/results. With --llama-bench, llama.cpp's
llama-bench runs on the same GGUF files in the same run and the table shows our / llama.cpp ratios
(same machine, same moment: the ratio is what to read, not the absolute figures).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # bench/, and the repo for tests/
from common import cached_model, print_table, timed  # noqa: E402

from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from tests.tiny_models import TargetConfig, write_target  # noqa: E402


def model_path(dtype: str) -> Path:
    cfg = TargetConfig.qwen3_0_6b_shape(dtype=dtype)  # with a tokenizer: llama.cpp needs one to load
    return cached_model(f"qwen3-0.6b-random-{dtype}.gguf", lambda p: write_target(p, cfg, seed=0, return_weights=False))


def ours(path: Path, threads: int, pp: int, tg: int, reps: int) -> tuple[float, float]:
    model = Model(path)
    ctx = Context(model, n_ctx=max(pp, tg) + 16, n_batch=max(pp, 1), n_threads=threads)
    toks = np.random.default_rng(0).integers(0, model.n_vocab, size=max(pp, tg)).astype(np.int32)

    def prompt() -> None:
        ctx.kv_clear()
        ctx.decode(toks[:pp])

    def generate() -> None:
        ctx.kv_clear()
        for i in range(tg):
            ctx.decode(toks[i:i + 1], [i])

    t_pp = timed(prompt, reps)
    t_tg = timed(generate, reps)
    return pp / t_pp, tg / t_tg


def llama_bench(exe: str, path: Path, threads: int, pp: int, tg: int, reps: int) -> tuple[float, float]:
    out = subprocess.run([exe, "-m", str(path), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
                          "-o", "json"], check=True, capture_output=True, text=True).stdout
    res = json.loads(out)
    by = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in res}
    return by["pp"], by["tg"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", type=Path, help="benchmark this GGUF instead of the random Qwen3-0.6B shape")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench, to compare on the same files")
    args = ap.parse_args()

    rows = []
    for dtype in ([None] if args.model else args.dtypes):
        path = args.model or model_path(dtype)
        pp, tg = ours(path, args.threads, args.pp, args.tg, args.reps)
        row = [path.name, f"pp{args.pp}", round(pp, 1)]
        if args.llama_bench:
            lpp, ltg = llama_bench(args.llama_bench, path, args.threads, args.pp, args.tg, args.reps)
            rows.append(row + [round(lpp, 1), round(pp / lpp, 2)])
            rows.append([path.name, f"tg{args.tg}", round(tg, 1), round(ltg, 1), round(tg / ltg, 2)])
        else:
            rows.append(row)
            rows.append([path.name, f"tg{args.tg}", round(tg, 1)])
    headers = ["model", "test", "dspark-ggml t/s"] + (["llama.cpp t/s", "ratio"] if args.llama_bench else [])
    print(f"threads={args.threads}")
    print_table(headers, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
