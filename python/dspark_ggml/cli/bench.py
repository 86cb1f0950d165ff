"""`dspark-ggml bench`: target-only vs speculative tokens/s, tau and acceptance on the same prompts.

Besides tokens/s and tau it prints the measured cost of one target-only decode step, of a draft
pass and of a verify pass, and the speedup they allow, tau * t_step / (t_draft + t_verify):
measured / ideal shows what the engine costs beyond the two passes. Acceptance by position goes
to stderr. `--sampling host backend` measures both places of sampling the verify rows side by side.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from ..benchmark import compare, default_prompt_file, load_prompts
from ..errors import InvalidArgumentError

FALLBACK_PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n",
                    "def is_prime(n):\n", "def merge_sort(items):\n"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="target GGUF (default: the demo pair)")
    p.add_argument("-md", "--model-draft", help="draft GGUF (default: the demo pair's)")
    p.add_argument("--prompts", help="JSONL prompt file ({\"turns\": [...]} per line)")
    p.add_argument("-np", "--n-prompts", type=int, default=8)
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--temp", "--temperatures", dest="temperatures", type=float, nargs="+", default=[0.0, 0.7])
    p.add_argument("--spec-draft-mode", dest="draft_modes", nargs="+", default=["greedy", "probabilistic"],
                   choices=["greedy", "probabilistic"])
    p.add_argument("--spec-draft-n-max", dest="n_max", type=int, default=0)
    p.add_argument("--sampling", nargs="+", choices=("host", "backend"), default=["host"],
                   help="where the target's verify rows are sampled (backend: in the graph); both: side by side")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..tokenizer import Tokenizer

    if not args.model:
        from .. import demo

        args.model, args.model_draft = demo.target_path(), args.model_draft or demo.DRAFT_PATH
    if not args.model_draft:
        raise InvalidArgumentError("bench needs a draft: -md DRAFT.gguf")
    path = args.prompts or default_prompt_file()
    texts = load_prompts(path, args.n_prompts) if path else FALLBACK_PROMPTS[:args.n_prompts]
    tok = Tokenizer.from_gguf(args.model)
    prompts = [tok.encode(t, add_special=False) for t in tqdm(texts, desc="tokenizing", disable=args.json)]
    rows = compare(args.model, args.model_draft, prompts, temperatures=args.temperatures, draft_modes=args.draft_modes,
                   max_tokens=args.max_tokens, n_threads=args.threads, n_max=args.n_max, eog=sorted(tok.eog_ids),
                   progress=not args.json, backend_sampling=[s == "backend" for s in args.sampling])
    if args.json:
        print(json.dumps([dict(temperature=r.temperature, draft_mode=r.draft_mode, target_tok_s=r.target_tok_s,
                               spec_tok_s=r.spec_tok_s, speedup=r.speedup, ideal_speedup=r.ideal_speedup,
                               measured_over_ideal=r.measured_over_ideal, t_target_step_ms=r.t_target_step_ms,
                               draft_ms_per_step=r.draft_ms, verify_ms_per_step=r.verify_ms,
                               **r.stats.to_dict()) for r in rows]))
        return 0
    for r in rows:
        acc = ", ".join(f"{a:.2f}" for a in r.stats.acceptance_by_position)
        print(f"T={r.temperature} {r.draft_mode}: acceptance by position [{acc}]", file=sys.stderr)
    print(f"{Path(args.model).name} + {Path(args.model_draft).name}; {len(prompts)} prompts"
          f"{f' from {Path(path).name}' if path else ''}, max_tokens={args.max_tokens}")
    print(f"{'T':>4} {'drafting':<22} {'target tok/s':>12} {'spec tok/s':>10} {'speedup':>7} {'tau':>5} {'accept':>6} "
          f"{'step ms':>7} {'draft ms':>8} {'verify ms':>9} {'ideal':>5} {'meas/ideal':>10}")
    for r in rows:
        print(f"{r.temperature:>4} {r.draft_mode:<22} {r.target_tok_s:>12.1f} {r.spec_tok_s:>10.1f} {r.speedup:>7.2f} "
              f"{r.stats.mean_accepted_length:>5.2f} {r.stats.acceptance_rate:>6.3f} {r.t_target_step_ms:>7.2f} "
              f"{r.draft_ms:>8.2f} {r.verify_ms:>9.2f} {r.ideal_speedup:>5.2f} {r.measured_over_ideal:>10.2f}")
    return 0
