"""Decode speed against llama.cpp on the same GGUFs, in one run, as a user meets both.

    python bench/bench_vs_llamacpp.py [--threads 2] [--n-prompts 6] [--max-tokens 128] [--runs demo q8_0 ...]

Runs (each a row: our tokens/s, llama.cpp's, ratio; medians over the prompts):
  demo-target   the demo target alone: our LLM vs llama-completion
  demo-spec     the demo pair, speculative (n_max 8): our LLM vs llama-speculative-simple --spec-type draft-dspark
  f16 / q8_0 / q4_0
                a random Qwen3 with Qwen3-0.6B's shape alone (64 tokens)
Greedy, HumanEval prompts (../shared/data/prompts), the same text given to both programs. Decode
speed counts the tokens after the first (both programs report it so). llama.cpp's programs come
from bench/llama_cpp_build.py (or --llama-bin DIR).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_target import model_path as qwen3_0_6b  # noqa: E402
from common import print_table  # noqa: E402
import llama_cpp_build  # noqa: E402

import dspark_ggml as dg  # noqa: E402
from dspark_ggml import demo  # noqa: E402
from dspark_ggml.benchmark import default_prompt_file, load_prompts  # noqa: E402

RUNS = ["demo-target", "demo-spec", "f16", "q8_0", "q4_0"]


def _ours(target: Path, draft: Path | None, prompts: list[str], max_tokens: int, threads: int) -> float:
    spec = dg.SpeculativeConfig(method="auto" if draft else "none", n_max=8)
    with dg.LLM(str(target), draft_model_path=str(draft) if draft else None, n_ctx=1024, n_threads=threads,
                speculative=spec) as llm:
        llm.generate(prompts[0], max_tokens=8)  # warm-up
        return statistics.median(llm.generate(p, max_tokens=max_tokens).stats.tokens_per_second for p in prompts)


_EVAL = re.compile(r"(?<!prompt )eval time =\s+[\d.]+ ms /\s+\d+ runs.*?([\d.]+) tokens per second")
_SPEC = re.compile(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s")


def _llama_cpp(bin_dir: Path, target: Path, draft: Path | None, prompts: list[str], max_tokens: int,
               threads: int) -> float:
    speeds = []
    for p in prompts:
        if draft:
            cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
                   "--spec-type", "draft-dspark", "--spec-draft-n-max", "8", "-p", p, "-n", str(max_tokens),
                   "--temp", "0", "-t", str(threads), "-td", str(threads), "-c", "1024"]
            pattern = _SPEC
        else:
            cmd = [str(bin_dir / "llama-completion"), "-m", str(target), "-p", p, "-n", str(max_tokens), "--temp", "0",
                   "-no-cnv", "--no-display-prompt", "-t", str(threads), "-c", "1024"]
            pattern = _EVAL
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, errors="replace")
        found = [m for m in pattern.findall(out.stdout + out.stderr)]
        if out.returncode != 0 or not found:
            raise RuntimeError(f"{cmd[0]} failed: {(out.stderr or out.stdout)[-1500:]}")
        speeds.append(float(found[-1]))
    return statistics.median(speeds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", nargs="+", default=RUNS, choices=RUNS)
    ap.add_argument("--llama-bin", type=Path, help="directory of llama.cpp's programs")
    args = ap.parse_args()
    bin_dir = args.llama_bin or llama_cpp_build.bin_dir()
    prompts = load_prompts(default_prompt_file(), args.n_prompts)

    rows = []
    for run in args.runs:
        if run.startswith("demo"):
            target, draft, n = Path(demo.target_path()), Path(demo.DRAFT_PATH) if run == "demo-spec" else None, args.max_tokens
        else:
            target, draft, n = qwen3_0_6b(run), None, 64
        ours = _ours(target, draft, prompts, n, args.threads)
        theirs = _llama_cpp(bin_dir, target, draft, prompts, n, args.threads)
        rows.append([run, target.name + (f" + {draft.name}" if draft else ""), n, round(ours, 1), round(theirs, 1),
                     round(ours / theirs, 2)])
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"threads={args.threads}, {len(prompts)} prompts, greedy")
    print_table(["run", "models", "tokens", "dspark-ggml t/s", "llama.cpp t/s", "ratio"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
