"""Verify schedules under batch load, at the engine (no HTTP): what each schedule drafts per step
and what a step costs, as the number of sequences decoded at once grows, on the demo pair.

    python bench/bench_schedule.py [--batch 1 4 16] [--schedules none static adaptive confidence]
                                   [--max-tokens 128] [--threads 1] [--flash-attn on|off] [--rounds 3]

Per batch size B: B greedy requests run at once (the short code starts bench_server.py sends,
bench/common.py's SHORT_PROMPTS; B = 1: each prompt alone, one after the other), until all finish;
--rounds runs of each, in turns, and the median one is shown. Per schedule and B: tokens/s over the
whole run (prefill included), the ratio to target-only decoding ("none") measured in the same run, steps,
the mean draft tokens per sequence and step, the share of step time spent drafting, and the
target and draft graphs built / reused. The contexts run the server's batch-invariant kernels.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from common import SHORT_PROMPTS as PROMPTS, print_table

from dspark_ggml import LLM
from dspark_ggml import demo
from dspark_ggml.sampling import SamplingParams


def load(schedule: str, n_seq: int, threads: int, flash: bool) -> LLM:
    spec = None if schedule == "none" else {"schedule": schedule}
    return LLM(demo.target_path(), draft_model_path=None if spec is None else demo.DRAFT_PATH, speculative=spec,
               n_seq_max=n_seq, n_threads=threads, flash_attn=flash, batch_invariant=True)


def run_batch(llm: LLM, prompts: list[str], max_tokens: int) -> dict:
    """Decode the prompts at once to the end; counters of the run."""
    eng = llm.engine
    g0, d0 = llm.context.graph_counts(), llm.draft_context.graph_counts() if llm.draft_context else (0, 0)
    s0 = eng.stats()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add(i, llm.tokenize(p), SamplingParams(temperature=0, max_tokens=max_tokens))
    blocks: Counter = Counter()
    while True:
        before = eng.stats()
        active = eng.step()
        after = eng.stats()
        seqs = after.n_steps - before.n_steps
        if seqs:
            blocks[(after.n_drafted - before.n_drafted) / seqs] += 1
        if active == 0:
            break
    wall = time.perf_counter() - t0
    s1 = eng.stats()
    for i in range(len(prompts)):
        eng.remove(i)
    g1, d1 = llm.context.graph_counts(), llm.draft_context.graph_counts() if llm.draft_context else (0, 0)
    return {"tokens": s1.n_generated - s0.n_generated, "wall": wall, "steps": sum(blocks.values()),
            "drafted": sum(k * v for k, v in blocks.items()), "t_draft": s1.t_draft_ms - s0.t_draft_ms,
            "t_verify": s1.t_verify_ms - s0.t_verify_ms,
            "graphs": (g1[0] - g0[0], g1[1] - g0[1], d1[0] - d0[0], d1[1] - d0[1])}


def measure(schedule: str, batch: int, args: argparse.Namespace) -> dict:
    with load(schedule, batch, args.threads, args.flash_attn == "on") as llm:
        run_batch(llm, PROMPTS[:batch], 8)  # warm up: first graphs, caches
        groups = [[p] for p in PROMPTS] if batch == 1 else [[PROMPTS[i % len(PROMPTS)] for i in range(batch)]]
        runs = [run_batch(llm, g, args.max_tokens) for g in groups]
    total = {k: sum(r[k] for r in runs) for k in ("tokens", "wall", "steps", "drafted", "t_draft", "t_verify")}
    total["graphs"] = tuple(sum(r["graphs"][i] for r in runs) for i in range(4))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--schedules", nargs="+", default=["none", "static", "adaptive", "confidence"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on")
    ap.add_argument("--rounds", type=int, default=3, help="runs per schedule, in turns; the median is shown")
    args = ap.parse_args()
    rows = []
    for batch in args.batch:
        base = None
        runs: dict[str, list[dict]] = {s: [] for s in args.schedules}
        for _ in range(args.rounds):  # schedules take turns: a load change hits them all
            for schedule in args.schedules:
                runs[schedule].append(measure(schedule, batch, args))
        for schedule in args.schedules:
            r = sorted(runs[schedule], key=lambda r: r["tokens"] / r["wall"])[args.rounds // 2]
            tps = r["tokens"] / r["wall"]
            base = tps if schedule == "none" else base
            steps = r["steps"] or 1
            spent = r["t_draft"] + r["t_verify"]
            rows.append([batch, schedule, tps, f"{tps / base:.2f}x" if base else "-", r["steps"],
                         r["drafted"] / steps, f"{r['t_draft'] / spent:.0%}" if spent else "-",
                         "{}/{}".format(*r["graphs"][:2]), "{}/{}".format(*r["graphs"][2:])])
            print(f"B={batch} {schedule}: {tps:.0f} tokens/s", file=sys.stderr, flush=True)
    print_table(["batch", "schedule", "tokens/s", "vs none", "steps", "draft/seq/step", "draft share",
                 "target graphs built/reused", "draft graphs built/reused"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
