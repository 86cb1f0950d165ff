"""What batch-invariant matmuls cost at one token: SmolLM2's decode speed with our CPU plans (the
default: a row comes out the same in any batch, so greedy speculation is lossless) next to ggml's
matmuls as they are (`DSPARK_CPU_MATMUL=ggml`: its kernels and repacked layouts chosen by batch
size, as before the plans existed), on the same files.

    python bench/bench_invariant.py [--types Q4_K_M q4_K ...] [--runs 5] [--n-prompts 2] [--max-tokens 96] [--threads 2]

Each run measures both modes in turn (fresh processes: the switch is read once per process), the
order alternating from run to run; the table gives every run's tokens/s and the ratio of the sums.
Decode speed is bench/common.decode_speed (LLM.generate, target only, the median over HumanEval
prompts through the chat template).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import add_prompts_arg, chat_prompts, decode_speed, print_table, prompt_texts, smollm2_file

TYPES = ["f16", "bf16", "q8_0", "q4_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs", "Q4_K_M"]
MODES = {"invariant": {}, "ggml": {"DSPARK_CPU_MATMUL": "ggml"}}


def measure(type_name: str, mode: str, args: argparse.Namespace) -> float:
    """tokens/s of one mode in a fresh process."""
    env = {**os.environ, **MODES[mode]}
    cmd = [sys.executable, __file__, "--worker", type_name, "--n-prompts", str(args.n_prompts), "--max-tokens",
           str(args.max_tokens), "--threads", str(args.threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_second"])


def worker(args: argparse.Namespace) -> None:
    import dspark_ggml as dg
    from dspark_ggml.models import smollm2_path

    prompts = chat_prompts(dg.Tokenizer.from_gguf(smollm2_path()), prompt_texts("humaneval", args.n_prompts))
    speed = decode_speed(smollm2_file(args.worker), prompts, args.max_tokens, args.threads)
    print(json.dumps({"tokens_per_second": speed}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0

    rows = []
    for t in args.types:
        smollm2_file(t)  # made (and cached) before any timing
        got: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.runs):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                got[mode].append(measure(t, mode, args))
        ratio = sum(got["invariant"]) / sum(got["ggml"])
        rows.append([t, " / ".join(f"{v:.1f}" for v in got["invariant"]), " / ".join(f"{v:.1f}" for v in got["ggml"]),
                     round(ratio, 3)])
        print(rows[-1], file=sys.stderr, flush=True)

    print(f"SmolLM2-135M-Instruct decode (target only), threads={args.threads}, {args.n_prompts} HumanEval prompts "
          f"through the chat template, {args.max_tokens} greedy tokens, median over the prompts; {args.runs} runs "
          f"per mode, alternating")
    print_table(["type", "batch-invariant t/s (each run)", "ggml's matmuls t/s (each run)", "invariant / ggml"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
