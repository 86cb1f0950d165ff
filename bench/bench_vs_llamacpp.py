"""Decode speed against llama.cpp on the same GGUFs, in one run, as a user meets both.

    python bench/bench_vs_llamacpp.py [--threads 2] [--n-prompts 6] [--max-tokens 128] [--runs demo-spec q8_0 ...]

Runs (each a row: our tokens/s, llama.cpp's, ratio; medians over the prompts):
  demo-target   the demo target alone: our LLM vs llama-completion
  demo-spec     the demo pair, speculative (n_max 8): our LLM vs llama-speculative-simple --spec-type draft-dspark
  f16 / q8_0 / q4_0
                a random Qwen3 with Qwen3-0.6B's shape alone (64 tokens)
  gemma3 / gemma3-f16 / gemma3-q8_0
                Gemma-3-270M alone: the shipped Q4_K_M file (dspark_ggml.models), or our requantization
Greedy, HumanEval prompts (../shared/data/prompts), the same text given to both programs. Decode
speed counts the tokens after the first (both programs report it so). llama.cpp's programs come
from bench/llama_cpp_build.py (or --llama-bin DIR).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import add_prompts_arg, real_model_file, decode_speed, llama_cpp_decode_speed, print_table, prompt_texts, qwen3_0_6b
import llama_cpp_build

import dspark_ggml as dg
from dspark_ggml import demo

RUNS = ["demo-target", "demo-spec", "f16", "q8_0", "q4_0", "gemma3", "gemma3-f16", "gemma3-q8_0"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", nargs="+", default=RUNS, choices=RUNS)
    ap.add_argument("--llama-bin", type=Path, help="directory of llama.cpp's programs")
    args = ap.parse_args()
    bin_dir = args.llama_bin or llama_cpp_build.bin_dir()
    prompts = prompt_texts("humaneval", args.n_prompts)

    rows = []
    for run in args.runs:
        if run.startswith("gemma3"):
            target, draft, n = real_model_file("gemma3", run.partition("-")[2] or "Q4_K_M"), None, args.max_tokens
        elif run.startswith("demo"):
            target, draft, n = Path(demo.target_path()), Path(demo.DRAFT_PATH) if run == "demo-spec" else None, args.max_tokens
        else:
            target, draft, n = qwen3_0_6b(run), None, 64
        spec = dg.SpeculativeConfig(method="auto" if draft else "none", n_max=8)
        ours = decode_speed(target, prompts, n, args.threads, draft=draft, speculative=spec)
        theirs = llama_cpp_decode_speed(bin_dir, target, draft, prompts, n, args.threads)
        rows.append([run, target.name + (f" + {draft.name}" if draft else ""), n, round(ours, 1), round(theirs, 1),
                     round(ours / theirs, 2)])
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"threads={args.threads}, {len(prompts)} prompts, greedy")
    print_table(["run", "models", "tokens", "dspark-ggml t/s", "llama.cpp t/s", "ratio"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
