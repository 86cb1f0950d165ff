"""The draft recipe's data stages on this CPU: tokens per second of `generate` (the target's answers,
n_seq sequences per batch) and `capture` (the captured layers and the teacher's top-k), the
stages of tools/train_draft/train.py as it runs them, for SmolLM2-135M in each weight type.

    python bench/bench_recipe_data.py [--types Q4_1 f16 q8_0] [--prompts 96] [--max-new 256]
        [--gen-seqs 32] [--threads 2] [--runs 2]

Q4_1 is the file SmolLM2 ships as (what `--demo` runs). The prompts are the recipe's own
(built by tools/train_draft/prompts.py, never the held-out sets); every run starts from an empty
data folder and prints its table.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "train_draft"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, smollm2_file  # noqa: E402


def one_run(path: str, prompts: list[dict], a) -> tuple[float, float]:
    import data
    import draft_model
    import gguf_target as gt

    info = gt.read_target(path)
    capture_ids = draft_model.feature_layer_ids(info.n_layer, 4)
    with tempfile.TemporaryDirectory() as d:
        gen = data.generate(path, d, prompts, max_new=a.max_new, max_prompt=384, sampled_per_prompt=1,
                            t_lo=0.7, t_hi=1.0, n_seq_max=a.gen_seqs, threads=a.threads,
                            shard_size=len(prompts) * 2)
        cap = data.capture(path, d, prompts, capture_ids=capture_ids, n_embd=info.n_embd,
                           threads=a.threads, n_batch=a.capture_batch, n_seq_max=16)
    return float(gen["tokens_per_s"]), float(cap["tokens_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1", "f16", "q8_0"])
    ap.add_argument("--prompts", type=int, default=96,
                    help="recipe prompts (each answered greedy and sampled)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--gen-seqs", type=int, default=32)
    ap.add_argument("--capture-batch", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()

    import torch
    from prompts import build_prompts

    torch.set_num_threads(a.threads)
    prompts = [p for p in build_prompts(a.prompts * 2, 1234) if p["split"] != "eval"][:a.prompts]
    print(f"{len(prompts)} recipe prompts, {a.max_new} new tokens, {a.gen_seqs} sequences per generation "
          f"batch, capture batches of {a.capture_batch} tokens, {a.threads} threads")
    for run in range(a.runs):
        rows = [(t, *one_run(str(smollm2_file(t)), prompts, a)) for t in a.types]
        print(f"\nrun {run + 1} of {a.runs}: tokens/s")
        print_table(["target", "generate", "capture"], [[t, round(g), round(c)] for t, g, c in rows])


if __name__ == "__main__":
    main()
