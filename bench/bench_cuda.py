"""A device's step costs with the default (batch-invariant) route next to ggml's kernels as they are,
on one model: decode steps, 9-row verify batches and 64-token prefills per second.

    python bench/bench_cuda.py [--model GGUF | --dtype q8_0] [--runs 2] [--steps 64] [--verifies 20]

Default model: the random Qwen3 with Qwen3-0.6B's shape (bench/common.py) in --dtype. The device is the
first non-CPU one (--device picks another; with DSPARK_DEVICE_RULES=cuda the CPU runs CUDA's graphs). Modes, each in a fresh process (the switches are read once per process), in
alternating order from run to run:
  default  attention in sequence order (by channels on CUDA) and the device's matmul route
  ggml     DSPARK_DEVICE_ATTENTION=ggml DSPARK_DEVICE_MATMUL=ggml: ggml's flash attention and matmuls,
           which are faster on some batches but give a verify row other bits than its decode step
  default, no CUDA graphs  (GGML_CUDA_DISABLE_GRAPHS=1) what the graphs save on CUDA
  1 column  (DSPARK_CUDA_COLUMNS=1) quantized weights one column per channel, not four (--modes picks)
The table gives every run, and "verify / decode" is what a 9-row verify costs in decode steps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import device_index, print_table, qwen3_0_6b, step_ms

MODES = {"default": {}, "ggml": {"DSPARK_DEVICE_ATTENTION": "ggml", "DSPARK_DEVICE_MATMUL": "ggml"},
         "default, no CUDA graphs": {"GGML_CUDA_DISABLE_GRAPHS": "1"},
         "1 column": {"DSPARK_CUDA_COLUMNS": "1"}}

def worker(args: argparse.Namespace) -> None:
    from dspark_ggml.context import Context
    from dspark_ggml.model import Model

    model = Model(args.model, device=device_index(args.device))
    ctx = Context(model, n_ctx=args.cells + args.steps + 128, n_batch=max(64, args.cells), n_threads=2,
                  n_outputs_max_per_seq=16)
    prompt = [(7 * i) % 256 for i in range(64)]
    ctx.decode(prompt)  # the graphs are built before the clock starts
    t0 = time.perf_counter()
    for _ in range(args.prefills):
        ctx.kv_seq_rm(0, 0)
        ctx.decode(prompt)
    pp = 64 * args.prefills / (time.perf_counter() - t0)
    ctx.kv_seq_rm(0, 0)
    decode_ms, verify_ms = step_ms(ctx, args.cells, args.steps, args.verifies)
    print(json.dumps({"decode_ms": decode_ms, "verify_ms": verify_ms, "pp": pp}))


def measure(mode: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", "--device", str(args.device), "--model", args.model, "--cells", str(args.cells), "--steps",
           str(args.steps), "--verifies", str(args.verifies), "--prefills", str(args.prefills)]
    out = subprocess.run(cmd, env={**os.environ, **MODES[mode]}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{mode}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cells", type=int, default=100, help="context before the decode steps")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--verifies", type=int, default=20)
    ap.add_argument("--prefills", type=int, default=5)
    ap.add_argument("--device", type=int, default=-1, help="device index (default: the first non-CPU one)")
    ap.add_argument("--modes", nargs="+", default=["default", "ggml", "default, no CUDA graphs"], choices=list(MODES))
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    args.model = args.model or str(qwen3_0_6b(args.dtype))
    rows, sums = [], {m: {"decode_ms": 0.0, "verify_ms": 0.0, "pp": 0.0} for m in args.modes}
    for run in range(args.runs):
        order = list(args.modes) if run % 2 == 0 else list(args.modes)[::-1]
        for mode in order:
            r = measure(mode, args)
            for k in r:
                sums[mode][k] += r[k]
            rows.append([run + 1, mode, int(round(1000 / r["decode_ms"])), round(r["decode_ms"], 2), round(r["verify_ms"], 2),
                         round(r["verify_ms"] / r["decode_ms"], 2), int(round(r["pp"]))])
    for mode in args.modes:
        s = sums[mode]
        rows.append(["all", mode, int(round(1000 * args.runs / s["decode_ms"])), round(s["decode_ms"] / args.runs, 2),
                     round(s["verify_ms"] / args.runs, 2), round(s["verify_ms"] / s["decode_ms"], 2),
                     int(round(s["pp"] / args.runs))])
    print(f"{os.path.basename(args.model)}, {args.cells} cells of context, {args.steps} decode steps, "
          f"{args.verifies} verifies of 9 rows, pp64 x{args.prefills}; {args.runs} runs")
    print_table(["run", "mode", "decode t/s", "decode ms", "verify ms", "verify / decode", "pp64 t/s"], rows)
    if "default" in sums and "ggml" in sums:
        d, g = sums["default"], sums["ggml"]
        print(f"\ndefault / ggml: decode speed {g['decode_ms'] / d['decode_ms']:.2f}x, verify speed "
              f"{g['verify_ms'] / d['verify_ms']:.2f}x, prefill {d['pp'] / g['pp']:.2f}x")


if __name__ == "__main__":
    main()
