"""What a user gets by default: speculative decoding with LLM's default settings against decoding
the same file without a draft, per held-out prompt set, with the demo's draft and with a useless
one (the demo draft's shapes filled with random values: it never predicts the target, so every
token it drafts is lost work), and each schedule next to the default.

    python bench/bench_default.py [--n-prompts 8] [--max-tokens 128] [--threads 2] [--runs 2]
                                  [--schedules default static adaptive confidence] [--sets ...]
                                  [--target T.gguf --draft D.gguf --no-chat]

--target / --draft measure another pair (the draft named "given"; e.g. bench_planted.py's, where
drafting pays: bench/results/planted-draft-q8_0-1.0.gguf on qwen3-0.6b-random-q8_0.gguf, --no-chat).

Demo pair (SmolLM2-135M-Instruct + its DSpark draft), the last --n-prompts prompts of each set
through the chat template, greedy. Tokens/s as LLM.generate reports them (the median over the
prompts, after a warm-up). Each run of a set loads every configuration afresh (a new LLM: its
schedule learns from nothing, as a user's first requests do) and takes the prompts one at a time,
each through every configuration in turn (the order rotated from prompt to prompt), so that a
shared machine's drift falls on all of them alike rather than on whichever ran last; every run is
printed, then the ratios to target-only in the same runs (the mean over the runs).
"""
from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from common import RESULTS, add_prompts_arg, chat_prompts, print_table, prompt_texts
from tests.gguf_edit import rewrite_gguf

import dspark_ggml as dg
from dspark_ggml import demo

SETS = ["gsm8k", "humaneval", "mt-bench"]


def useless_draft(src: Path) -> Path:
    """The draft's shapes and keys with random f16 weights (norms 1, biases 0): a draft that drafts
    as fast as the real one and is never right."""
    import gguf

    out = RESULTS / f"useless-{src.name}"
    if out.exists():
        return out
    RESULTS.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = {}
    for t in gguf.GGUFReader(src).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.I64:
            continue  # d2t stays: the reduced vocabulary is the real one
        if "norm" in t.name:
            tensors[t.name] = np.ones(shape, np.float32)
        elif t.name.endswith(".bias"):
            tensors[t.name] = np.zeros(shape, np.float32)
        else:
            tensors[t.name] = (rng.standard_normal(shape) * 0.05).astype(np.float16)
    return rewrite_gguf(src, out, tensors=tensors)


def config(schedule: str) -> dg.SpeculativeConfig:
    return dg.SpeculativeConfig() if schedule == "default" else dg.SpeculativeConfig(schedule=schedule)


def paired_speeds(target: str, drafts: dict, configs: list, prompts: list, max_tokens: int, threads: int,
                  reverse: bool) -> dict:
    """{config: median tokens/s over the prompts}, every configuration loaded at once and each prompt
    run through all of them before the next (a new LLM each: the schedules start from nothing)."""
    with ExitStack() as stack:
        llms = {}
        for schedule, draft in configs:
            llms[(schedule, draft)] = stack.enter_context(dg.LLM(
                target, draft_model_path=str(drafts[draft]) if draft else None, n_ctx=1024, n_threads=threads,
                speculative=None if draft is None else config(schedule)))
            llms[(schedule, draft)].generate(prompts[0], max_tokens=8)  # warm-up: first graphs, caches
        speeds = {c: [] for c in configs}
        for i, p in enumerate(prompts):
            order = configs[i % len(configs):] + configs[:i % len(configs)]
            for c in (order[::-1] if reverse else order):
                speeds[c].append(llms[c].generate(p, max_tokens=max_tokens).stats.tokens_per_second)
    return {c: statistics.median(v) for c, v in speeds.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sets", nargs="+", default=SETS)
    ap.add_argument("--schedules", nargs="+", default=["default", "static"])
    ap.add_argument("--drafts", nargs="+", default=None, choices=["demo", "useless", "given"])
    ap.add_argument("--target", help="target GGUF (default: the demo's)")
    ap.add_argument("--draft", help="a draft GGUF for --target (measured as the draft 'given')")
    ap.add_argument("--no-chat", action="store_true", help="the prompts as they are, not through a chat template")
    ap.add_argument("--first", action="store_true", help="the first --n-prompts of each set, not the last")
    args = ap.parse_args()
    target = args.target or demo.target_path()
    drafts = {"demo": Path(demo.DRAFT_PATH)}
    if args.draft:
        drafts["given"] = Path(args.draft)
    args.drafts = args.drafts or (["given"] if args.draft else ["demo", "useless"])
    if "useless" in args.drafts:
        drafts["useless"] = useless_draft(Path(demo.DRAFT_PATH))
    tok = dg.Tokenizer.from_gguf(target)
    print(f"{Path(target).name} + {', '.join(drafts[d].name for d in args.drafts)}; the "
          f"{'first' if args.first else 'last'} {args.n_prompts} prompts "
          f"of each set{'' if args.no_chat else ' through the chat template'}, "
          f"{args.max_tokens} tokens, threads={args.threads}, {args.runs} runs; default schedule: "
          f"{dg.SpeculativeConfig().schedule}", flush=True)
    configs = [("none", None)] + [(s, d) for d in args.drafts for s in args.schedules]
    rows, sums = [], {}
    for name in args.sets:
        texts = prompt_texts(name, args.n_prompts, last=not args.first)
        prompts = [tok.encode(p, add_special=False, parse_special=True)
                   for p in (texts if args.no_chat else chat_prompts(tok, texts))]
        for run in range(args.runs):
            got = paired_speeds(str(target), drafts, configs, prompts, args.max_tokens, args.threads,
                                reverse=run % 2 == 1)
            base = got[("none", None)]
            for key, v in got.items():
                sums.setdefault((name, key), []).append(v / base)
            rows.append([name, run + 1, round(base, 1)] + [round(got[c], 1) for c in configs[1:]])
    print_table(["set", "run", "target-only t/s"] + [f"{d} draft, {s}" for s, d in configs[1:]], rows)
    print()
    print_table(["set"] + [f"{d} draft, {s} / target-only" for s, d in configs[1:]],
                [[name] + [round(float(np.mean(sums[(name, c)])), 3) for c in configs[1:]] for name in args.sets])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
