"""Speculation where a decode step is not overhead-bound: a random Qwen3 with Qwen3-0.6B's shape
and a planted DSpark draft for it, next to llama.cpp on the same two files.

    python bench/bench_planted.py [--dtype q8_0] [--accept 1.0] [--n-prompts 3] [--max-tokens 64]

The draft (1 layer, block 8) has a Markov head that holds the target's own greedy bigrams on the
benchmark prompts (a rank-256 table: W1 one-hot rows of the path's tokens, W2 a bias on each successor), so its chains follow the target; --accept plants only that fraction of the bigrams,
which tunes acceptance. The draft's vocabulary is reduced (d2t, as speculators' drafts are) to the
paths' tokens, its head zero. Prints target-only and speculative tokens/s for both programs, tau, and
our measured speedup against the ideal one, tau * t_decode / (t_verify + t_draft).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from bench_target import model_path as qwen3_0_6b  # noqa: E402
from bench_vs_llamacpp import _llama_cpp  # noqa: E402
from common import RESULTS, print_table  # noqa: E402
import llama_cpp_build  # noqa: E402

from dspark_ggml.benchmark import compare, default_prompt_file, load_prompts  # noqa: E402
from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.engine import Engine  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from dspark_ggml.sampling import SamplingParams  # noqa: E402
from tests.tiny_models import DraftConfig, TargetConfig, write_draft  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402

RANK = 256


def greedy_paths(target: Path, prompts: list[list[int]], n: int, threads: int) -> list[list[int]]:
    model = Model(target)
    out = []
    for p in prompts:
        eng = Engine(Context(model, n_ctx=len(p) + n + 8, n_threads=threads))
        out.append(p[-1:] + eng.generate(p, SamplingParams(max_tokens=n)))
    return out


def draft_config(vocab: int) -> DraftConfig:
    """The planted drafts' shape (1 layer, block 8, a rank-RANK Markov head, an own head over a
    reduced vocabulary of `vocab` tokens), shared by bench_planted_sampled.py."""
    return DraftConfig(n_layer=1, n_head=16, n_head_kv=8, head_dim=64, n_ff=3072, block_size=8, markov_rank=RANK,
                       target_layers=[1, 14, 27], draft_vocab=vocab, own_head=True, dtype="q8_0")


def planted_draft(target: Path, paths: list[list[int]], accept: float, out: Path) -> Path:
    """A reduced-vocabulary draft (as speculators' are) whose vocabulary holds the paths' tokens:
    its head is zero and its Markov table carries the planted bigrams, so W2 is small."""
    cfg = TargetConfig.qwen3_0_6b_shape()
    tokens = sorted({t for path in paths for t in path})
    vd = max(RANK, len(tokens))
    src = out.with_suffix(".src.gguf")
    write_draft(src, draft_config(vd), cfg, seed=1, return_weights=False)
    rest = [t for t in range(cfg.n_vocab) if t not in set(tokens)][: vd - len(tokens)]
    d2t = np.array(tokens + rest, dtype=np.int64)  # draft id -> target id
    draft_id = {int(t): i for i, t in enumerate(d2t)}
    rng = np.random.default_rng(0)
    pairs: dict[int, int] = {}
    for path in paths:
        for a, b in zip(path, path[1:]):
            if a not in pairs and len(pairs) < RANK and rng.random() < accept:
                pairs[a] = b
    w1 = np.zeros((cfg.n_vocab, RANK), np.float32)  # numpy [V, R]: e = W1[prev] (target ids)
    w2 = np.zeros((vd, RANK), np.float32)           # numpy [Vd, R]: bias = W2 e (draft ids)
    for r, (a, b) in enumerate(pairs.items()):
        w1[a, r] = 1.0
        w2[draft_id[b], r] = 30.0
    rewrite_gguf(src, out, tensors={"markov_w1.weight": w1, "markov_w2.weight": w2, "d2t": d2t,
                                    "output.weight": np.zeros((vd, cfg.n_embd), np.float32)})
    src.unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="q8_0", choices=["f16", "q8_0", "q4_0"])
    ap.add_argument("--accept", type=float, default=1.0, help="fraction of the greedy bigrams planted")
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args()

    target = qwen3_0_6b(args.dtype)
    tok = Tokenizer.from_gguf(target)
    texts = load_prompts(default_prompt_file(), args.n_prompts)
    prompts = [tok.encode(t, add_special=False) for t in texts]
    paths = greedy_paths(target, prompts, args.max_tokens, args.threads)
    draft = planted_draft(target, paths, args.accept, RESULTS / f"planted-draft-{args.dtype}-{args.accept}.gguf")

    row = compare(target, draft, prompts, max_tokens=args.max_tokens, n_threads=args.threads)[0]
    st = row.stats
    table = [["dspark-ggml", round(row.target_tok_s, 1), round(row.spec_tok_s, 1), round(row.speedup, 2),
              round(st.mean_accepted_length, 2), round(row.ideal_speedup, 2), round(row.speedup / row.ideal_speedup, 2)]]
    if not args.no_llama_cpp:
        bin_dir = llama_cpp_build.bin_dir()
        base = _llama_cpp(bin_dir, target, None, texts, args.max_tokens, args.threads)
        spec = _llama_cpp(bin_dir, target, draft, texts, args.max_tokens, args.threads)
        table.append(["llama.cpp", round(base, 1), round(spec, 1), round(spec / base, 2), "", "", ""])
        table.append(["ratio", round(row.target_tok_s / base, 2), round(row.spec_tok_s / spec, 2), "", "", "", ""])
    print(f"{target.name} + planted draft (accept {args.accept}); {len(prompts)} prompts, {args.max_tokens} tokens, "
          f"threads={args.threads}; per step: draft {st.t_draft_ms / st.n_steps:.2f} ms, "
          f"verify {st.t_verify_ms / st.n_steps:.2f} ms, host {st.t_host_ms / st.n_steps:.3f} ms")
    print_table(["program", "target-only t/s", "speculative t/s", "speedup", "tau", "ideal speedup", "measured/ideal"],
                table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
