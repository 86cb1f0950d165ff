"""End to end: target-only vs speculative decoding on the same prompts, in one run.

    python bench/bench_spec.py [-m T.gguf -md D.gguf] [--prompts ../shared/data/prompts/humaneval.jsonl] [-n 8]

Default models: the demo pair (SmolLM2-135M-Instruct and its trained draft). Prints tokens/s of both, tau (mean
accepted length counting the target's token), acceptance, the measured cost of a draft pass and of
a verify pass, and the ideal speedup they imply: tau * t_target_step / (t_draft + t_verify).
measured / ideal shows what the engine costs beyond the two passes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from dspark_ggml.benchmark import compare, default_prompt_file, load_prompts  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-md", "--model-draft")
    ap.add_argument("--prompts", type=Path, default=default_prompt_file())
    ap.add_argument("-n", "--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--draft-modes", nargs="+", default=["greedy", "probabilistic"])
    ap.add_argument("--n-max", type=int, default=0)
    ap.add_argument("--sampling", nargs="+", choices=("host", "backend"), default=["host"],
                    help="where the target's verify rows are sampled; both: side by side")
    args = ap.parse_args()
    if not args.model:
        from dspark_ggml import demo
        args.model, args.model_draft = demo.target_path(), args.model_draft or demo.DRAFT_PATH

    tok = Tokenizer.from_gguf(args.model)
    prompts = [tok.encode(p, add_special=False) for p in load_prompts(args.prompts, args.n_prompts)]
    rows = compare(args.model, args.model_draft, prompts, temperatures=args.temperatures, draft_modes=args.draft_modes,
                   max_tokens=args.max_tokens, n_threads=args.threads, n_max=args.n_max, eog=sorted(tok.eog_ids),
                   backend_sampling=[s == "backend" for s in args.sampling])
    for r in rows:
        acc = ", ".join(f"{a:.2f}" for a in r.stats.acceptance_by_position)
        print(f"T={r.temperature} {r.draft_mode}: acceptance by position [{acc}]", file=sys.stderr)
    print(f"{Path(args.model).name} + {Path(args.model_draft).name}; {len(prompts)} prompts from {args.prompts.name}, "
          f"max_tokens={args.max_tokens}, threads={args.threads}")
    table = []
    for r in rows:
        st = r.stats
        table.append([r.temperature, r.draft_mode, round(r.target_tok_s, 1), round(r.spec_tok_s, 1), round(r.speedup, 2),
                      round(st.mean_accepted_length, 2), round(st.acceptance_rate, 3), round(r.t_target_step_ms, 2),
                      round(st.t_draft_ms / st.n_steps, 2), round(st.t_verify_ms / st.n_steps, 2),
                      round(r.ideal_speedup, 2), round(r.speedup / r.ideal_speedup, 2) if r.ideal_speedup else 0])
    print_table(["T", "drafting", "target-only tok/s", "speculative tok/s", "speedup", "tau", "acceptance",
                 "target step ms", "draft ms/step", "verify ms/step", "ideal speedup", "measured/ideal"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
