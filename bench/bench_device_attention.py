"""What attention in sequence order costs on a device: decode steps and 9-token verify batches per
second with it (the default for a KV cache on a device: verify rows equal decode steps at any
length, so greedy speculation is lossless) next to ggml's flash attention
(`DSPARK_DEVICE_ATTENTION=ggml`), on the same model and device.

    python bench/bench_device_attention.py [--model GGUF] [--cells 100] [--runs 2] [--steps 20] [--verifies 5]

Default model: SmolLM2-135M-Instruct Q4_1 (fetched once, see dspark_ggml.models). The device is the
first non-CPU one (on a CPU-only machine with Mesa's lavapipe: GGML_VK_VISIBLE_DEVICES=0 and a Vulkan
build). Each run measures both modes in turn (fresh processes: the switch is read once per process),
the order alternating from run to run; the table gives every run and the ratio of the sums.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import device_index, print_table, step_ms

MODES = {"in order": {}, "ggml": {"DSPARK_DEVICE_ATTENTION": "ggml"}}


def measure(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """{decode, verify}: per second, in a fresh process."""
    env = {**os.environ, **MODES[mode]}
    cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--cells", str(args.cells), "--steps",
           str(args.steps), "--verifies", str(args.verifies)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(args: argparse.Namespace) -> None:
    from dspark_ggml.context import Context
    from dspark_ggml.model import Model
    model = Model(args.model, device=device_index())
    ctx = Context(model, n_ctx=args.cells + args.steps + 64, n_batch=max(64, args.cells), n_threads=2)
    decode_ms, verify_ms = step_ms(ctx, args.cells, args.steps, args.verifies)
    print(json.dumps({"decode": 1000 / decode_ms, "verify": 1000 / verify_ms}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--cells", type=int, default=100, help="tokens in the cache before the clock starts")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed per run")
    ap.add_argument("--verifies", type=int, default=5, help="9-token verify batches timed per run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from dspark_ggml.models import smollm2_path

        args.model = str(smollm2_path())
    if args.worker:
        worker(args)
        return 0

    got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(args.runs):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
            got[mode].append(measure(mode, args))
    rows = []
    for what in ("decode", "verify"):
        runs = {m: [g[what] for g in got[m]] for m in MODES}
        rows.append([f"{what} /s", " ".join(f"{v:.2f}" for v in runs["in order"]),
                     " ".join(f"{v:.2f}" for v in runs["ggml"]), f"{sum(runs['in order']) / sum(runs['ggml']):.2f}x"])
    print(f"model {os.path.basename(args.model)}, {args.cells} cells, {args.runs} runs "
          f"({args.steps} decode steps, {args.verifies} 9-token verifies each)")
    print_table(["", "in order (each run)", "ggml flash attention", "ratio"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
