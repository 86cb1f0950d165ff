"""End to end: target-only vs speculative decoding on the same prompts, in one run.

    python bench/bench_spec.py [--prompts ../shared/data/prompts/humaneval.jsonl] [-n 8] [--max-tokens 128]

Default models: the demo pair that ships with the package. Prints tokens/s of both, tau (mean
accepted length counting the target's token), acceptance, the measured cost of a draft pass and of
a verify pass, and the ideal speedup they imply: tau * t_target_token / (t_draft + t_verify) per
step. measured / ideal shows what the engine itself costs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.draft import DraftContext, DraftModel  # noqa: E402
from dspark_ggml.engine import Engine  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from dspark_ggml.sampling import SamplingParams  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts" / "humaneval.jsonl"


def load_prompts(path: Path, n: int) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line)["turns"][0])
            if len(out) == n:
                break
    return out


def run(engine: Engine, prompts: list[list[int]], sp: SamplingParams) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    for i, p in enumerate(prompts):
        sp.seed = i
        n += len(engine.generate(p, sp))
        engine.remove(0)
    return n, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-md", "--model-draft")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("-n", "--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--draft-modes", nargs="+", default=["greedy", "probabilistic"])
    ap.add_argument("--n-max", type=int, default=0)
    args = ap.parse_args()
    if not args.model:
        from dspark_ggml import demo
        args.model, args.model_draft = demo.TARGET_PATH, args.model_draft or demo.DRAFT_PATH

    tok = Tokenizer.from_gguf(args.model)
    target = Model(args.model)
    draft = DraftModel(args.model_draft, target)
    prompts = [tok.encode(p, add_special=False) for p in load_prompts(args.prompts, args.n_prompts)]
    n_ctx = max(len(p) for p in prompts) + args.max_tokens + 32
    eog = sorted(tok.eog_ids)

    def engine(with_draft: bool, mode: str = "greedy") -> Engine:
        ctx = Context(target, n_ctx=n_ctx, n_threads=args.threads)
        dctx = DraftContext(draft, n_ctx=n_ctx, n_threads=args.threads) if with_draft else None
        return Engine(ctx, dctx, n_max=args.n_max, draft_mode=mode, eog=eog)

    rows = []
    for temp in args.temperatures:
        base = engine(False)
        n0, t0 = run(base, prompts, SamplingParams(temperature=temp, max_tokens=args.max_tokens))
        sb = base.stats()
        t_token = sb.t_verify_ms / max(sb.n_steps, 1)
        for mode in args.draft_modes:
            if temp == 0.0 and mode == "probabilistic":
                continue  # at temperature 0 both modes are the argmax chain
            eng = engine(True, mode)
            n1, t1 = run(eng, prompts, SamplingParams(temperature=temp, max_tokens=args.max_tokens))
            st = eng.stats()
            t_draft = st.t_draft_ms / st.n_steps
            t_verify = st.t_verify_ms / st.n_steps
            ideal = st.mean_accepted_length * t_token / (t_draft + t_verify)
            speedup = (n1 / t1) / (n0 / t0)
            rows.append([temp, mode, round(n0 / t0, 1), round(n1 / t1, 1), round(speedup, 2), round(st.mean_accepted_length, 2),
                         round(st.acceptance_rate, 3), round(t_token, 2), round(t_draft, 2), round(t_verify, 2),
                         round(ideal, 2), round(speedup / ideal, 2)])
            acc = ", ".join(f"{a:.2f}" for a in st.acceptance_by_position)
            print(f"T={temp} {mode}: acceptance by position [{acc}]", file=sys.stderr)
    print(f"{Path(args.model).name} + {Path(args.model_draft).name}; {len(prompts)} prompts from {args.prompts.name}, "
          f"max_tokens={args.max_tokens}, threads={args.threads}")
    print_table(["T", "drafting", "target-only tok/s", "speculative tok/s", "speedup", "tau", "acceptance",
                 "target step ms", "draft ms/step", "verify ms/step", "ideal speedup", "measured/ideal"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
