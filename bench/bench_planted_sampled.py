"""Sampled speculation where a decode step is not overhead-bound: a Qwen3-0.6B-shaped target whose
next-token distribution is planted, and a DSpark draft that knows it, at temperature 0.7.

    python bench/bench_planted_sampled.py [--context 0.01] [--temperatures 0.7] [--n-prompts 3] [--max-tokens 64] [--sampling host backend]

bench_planted.py plants the target's greedy bigrams, which says nothing about sampling: once a
sampled token leaves the greedy path, its chains are lost. Here the target itself is planted.
Its embeddings and its (untied) head make it a rank-256 bigram model over 512 tokens:

    logits(next | cur) = a_cur . b_next      (a_cur: row cur of the embedding; b: rows of the head)

and the other 151k tokens sit 30 logits below. Its 28 layers are the random 0.6B model's, with their
writes to the residual stream (attn_output, ffn_down) scaled by --context: at 0 the layers are
computed but change nothing, larger values mix the context into every distribution and so tune
how far the draft's guess is from the truth. The draft (1 layer, block 8, vocabulary reduced by d2t
to the 512 tokens, head zero) holds the same bigram table in its Markov head: W1[cur] = a_cur,
W2[next] = b_next (with the target's RMS-norm factor). So its probabilistic chain draws each slot
from the target's distribution given the slot before, as an ideal draft would; its greedy chain
proposes the bigram argmax, which a sampled target keeps only as often as it draws it.

Prints target-only, greedy-chain and probabilistic-chain tokens/s side by side, tau and acceptance,
the per-step costs, and measured/ideal speedup (ideal = tau * t_decode / (t_verify + t_draft)).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from bench_planted import RANK, draft_config  # noqa: E402
from bench_target import model_path as qwen3_0_6b  # noqa: E402
from common import RESULTS, cached_model, print_table  # noqa: E402

from dspark_ggml.benchmark import compare, default_prompt_file, load_prompts  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402
from tests.tiny_models import TargetConfig, write_draft  # noqa: E402

SUPPORT = 512     # tokens the bigram model can produce (the draft's vocabulary)
LOGIT_STD = 3.0   # spread of the planted logits: a few likely successors per token
OUTSIDE = -30.0   # logit of the tokens outside the support


class BigramPlan:
    """The planted table: unit-RMS rows a [V, R] (input side), b [S, R] (output side), the support ids.

    The target's embedding of token t is [a_t, 1, 0, ...] (width E), so RMS-norm divides by
    rms = sqrt((R + 1) / E) and the head row [b_s, 0, ...] gives logit a_t . b_s / rms; the outside
    rows [0, -k, 0, ...] give -k / rms."""

    def __init__(self, n_vocab: int, n_embd: int, support: np.ndarray, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((n_vocab, RANK)).astype(np.float32)
        self.a = a / np.sqrt((a * a).mean(axis=1, keepdims=True))  # |a_t|^2 = R for every token
        self.rms = float(np.sqrt((RANK + 1) / n_embd))
        # a_t . b_s has standard deviation sqrt(R) * std(b): scaled so the logits' is LOGIT_STD
        self.b = (rng.standard_normal((len(support), RANK)) * LOGIT_STD * self.rms / np.sqrt(RANK)).astype(np.float32)
        self.support = support
        self.n_vocab, self.n_embd = n_vocab, n_embd

    def embedding(self) -> np.ndarray:
        e = np.zeros((self.n_vocab, self.n_embd), np.float32)
        e[:, :RANK] = self.a
        e[:, RANK] = 1.0
        return e

    def head(self) -> np.ndarray:
        h = np.zeros((self.n_vocab, self.n_embd), np.float32)
        h[:, RANK] = OUTSIDE * self.rms
        h[self.support, RANK] = 0.0
        h[self.support, :RANK] = self.b
        return h


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    q = gguf.GGMLQuantizationType.Q8_0
    return np.asarray(gguf.quants.quantize(x, q)), q


def _scaled_q8_0(data: np.ndarray, factor: float) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """A Q8_0 tensor's bytes with every block's scale (its first two bytes, f16) multiplied."""
    blocks = np.array(data, dtype=np.uint8).reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16)
    blocks[:, :2] = (d.astype(np.float32) * factor).astype(np.float16).view(np.uint8)
    return blocks.reshape(data.shape), gguf.GGMLQuantizationType.Q8_0


def planted_target(src: Path, plan: BigramPlan, context: float, out: Path) -> Path:
    reader = gguf.GGUFReader(src)
    tensors: dict[str, object] = {"token_embd.weight": _q8_0(plan.embedding()), "output.weight": _q8_0(plan.head()),
                                  "output_norm.weight": np.ones(plan.n_embd, np.float32)}
    for t in reader.tensors:
        if t.name.endswith(("attn_output.weight", "ffn_down.weight")):
            if t.tensor_type != gguf.GGMLQuantizationType.Q8_0:
                raise SystemExit(f"{src} is not q8_0 ({t.name} is {t.tensor_type.name})")
            tensors[t.name] = _scaled_q8_0(t.data, context)
    return rewrite_gguf(src, out, tensors=tensors)


def planted_draft(plan: BigramPlan, out: Path) -> Path:
    cfg = TargetConfig.qwen3_0_6b_shape()
    src = out.with_suffix(".src.gguf")
    write_draft(src, draft_config(SUPPORT), cfg, seed=1, return_weights=False)
    # bias(next | cur) = W2[next] . W1[cur] = b_next . a_cur / rms: the target's logit
    rewrite_gguf(src, out, tensors={"markov_w1.weight": plan.a, "markov_w2.weight": plan.b / plan.rms,
                                    "d2t": plan.support.astype(np.int64),
                                    "output.weight": np.zeros((SUPPORT, cfg.n_embd), np.float32)})
    src.unlink()
    return out


def support_tokens(prompts: list[list[int]], n_vocab: int) -> np.ndarray:
    """The prompts' own tokens first (so the text is made of familiar pieces), then others."""
    seen = list(dict.fromkeys(t for p in prompts for t in p))[:SUPPORT]
    rest = [t for t in range(1000, n_vocab) if t not in set(seen)][: SUPPORT - len(seen)]
    return np.array(sorted(seen + rest), dtype=np.int64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=float, default=0.01,
                    help="scale of the layers' writes to the residual stream (0: a pure bigram model)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7])
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sampling", nargs="+", choices=("host", "backend"), default=["host"],
                    help="where the target's verify rows are sampled; both: side by side")
    args = ap.parse_args()

    base = qwen3_0_6b("q8_0")
    tok = Tokenizer.from_gguf(base)
    prompts = [tok.encode(t, add_special=False) for t in load_prompts(default_prompt_file(), args.n_prompts)]
    cfg = TargetConfig.qwen3_0_6b_shape()
    plan = BigramPlan(cfg.n_vocab, cfg.n_embd, support_tokens(prompts, cfg.n_vocab))
    target = cached_model(f"planted-bigram-target-{args.n_prompts}-{args.context}.gguf",
                          lambda p: planted_target(base, plan, args.context, p))
    draft = cached_model(f"planted-bigram-draft-{args.n_prompts}.gguf", lambda p: planted_draft(plan, p))

    rows = compare(target, draft, prompts, temperatures=args.temperatures, draft_modes=["greedy", "probabilistic"],
                   max_tokens=args.max_tokens, n_threads=args.threads,
                   backend_sampling=[s == "backend" for s in args.sampling])
    table = []
    for r in rows:
        st = r.stats
        table.append([r.temperature, r.draft_mode, round(r.target_tok_s, 1), round(r.spec_tok_s, 1), round(r.speedup, 2),
                      round(st.mean_accepted_length, 2), round(st.acceptance_rate, 3),
                      round(st.t_draft_ms / st.n_steps, 2), round(st.t_verify_ms / st.n_steps, 2),
                      round(st.t_host_ms / st.n_steps, 3), round(r.ideal_speedup, 2), round(r.speedup / r.ideal_speedup, 2)])
    print(f"{target.name} + {draft.name}; {len(prompts)} prompts, {args.max_tokens} tokens, threads={args.threads}")
    print_table(["T", "drafting", "target-only t/s", "speculative t/s", "speedup", "tau", "acceptance",
                 "draft ms/step", "verify ms/step", "host ms/step", "ideal speedup", "measured/ideal"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
