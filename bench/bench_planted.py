"""Speculation where a decode step is not overhead-bound: the random Qwen3 with Qwen3-0.6B's shape
(bench/common.py) and a DSpark draft planted for it, so that acceptance is high and known.

    python bench/bench_planted.py greedy [--dtype q8_0] [--accept 1.0] [--no-llama-cpp]
    python bench/bench_planted.py sampled [--context 0.01] [--temperatures 0.7] [--sampling host backend]
    (both: [--n-prompts 3] [--max-tokens 64] [--threads 2]; HumanEval prompts)

Both drafts have 1 layer, block 8, a rank-256 Markov head that holds the planted table and a zero
own head over a reduced vocabulary (d2t, as speculators' drafts have). Both print target-only and
speculative tokens/s, tau, acceptance, the per-step costs and the measured speedup against the
ideal one, tau * t_decode / (t_verify + t_draft).

greedy: the draft's Markov head holds the target's own greedy bigrams on the prompts (W1 one-hot
rows of the paths' tokens, W2 a bias on each successor; its vocabulary is the paths' tokens), so its
chains follow the target; --accept plants only that fraction of the bigrams, which tunes acceptance.
llama.cpp's llama-speculative-simple runs on the same two files.

sampled: a greedy plant says nothing about sampling (once a sampled token leaves the greedy path,
its chains are lost), so here the target itself is planted. Its embeddings and its (untied) head
make it a rank-256 bigram model over 512 tokens,

    logits(next | cur) = a_cur . b_next      (a_cur: row cur of the embedding; b: rows of the head)

and the other 151k tokens sit 30 logits below. Its 28 layers are the random model's, with their
writes to the residual stream (attn_output, ffn_down) scaled by --context: at 0 the layers are
computed but change nothing, larger values mix the context into every distribution and so tune
how far the draft's guess is from the truth. The draft's Markov head holds the same bigram table:
W1[cur] = a_cur, W2[next] = b_next (with the target's RMS-norm factor). So its probabilistic chain
draws each slot from the target's distribution given the slot before, as an ideal draft would; its
greedy chain proposes the bigram argmax, which a sampled target keeps only as often as it draws it.
Temperature 0.7 by default, both chains side by side. (This mode was bench_planted_sampled.py.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

from common import RESULTS, add_prompts_arg, SPEC_HEADERS, cached_model, llama_cpp_decode_speed, print_table, prompt_texts, \
    qwen3_0_6b, spec_cells
from tests.gguf_edit import rewrite_gguf
from tests.tiny_models import DraftConfig, TargetConfig, write_draft
import llama_cpp_build

from dspark_ggml.benchmark import compare
from dspark_ggml.context import Context
from dspark_ggml.engine import Engine
from dspark_ggml.model import Model
from dspark_ggml.sampling import SamplingParams
from dspark_ggml.tokenizer import Tokenizer

RANK = 256        # the Markov head's rank
SUPPORT = 512     # sampled: tokens the bigram model can produce (the draft's vocabulary)
LOGIT_STD = 3.0   # sampled: spread of the planted logits, a few likely successors per token
OUTSIDE = -30.0   # sampled: logit of the tokens outside the support
SHAPE = TargetConfig.qwen3_0_6b_shape()


def markov_draft(out: Path, d2t: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> Path:
    """The planted draft: 1 layer, block 8, vocabulary d2t (draft id -> target id), the Markov head
    bias(next | cur) = W2[next] . W1[cur] (w1 [V, R] by target id, w2 [Vd, R] by draft id), own head zero."""
    cfg = DraftConfig(n_layer=1, n_head=16, n_head_kv=8, head_dim=64, n_ff=3072, block_size=8, markov_rank=RANK,
                      target_layers=[1, 14, 27], draft_vocab=len(d2t), own_head=True, dtype="q8_0")
    src = out.with_suffix(".src.gguf")
    write_draft(src, cfg, SHAPE, seed=1, return_weights=False)
    rewrite_gguf(src, out, tensors={"markov_w1.weight": w1, "markov_w2.weight": w2, "d2t": d2t.astype(np.int64),
                                    "output.weight": np.zeros((len(d2t), SHAPE.n_embd), np.float32)})
    src.unlink()
    return out


# ---- greedy: the target's greedy bigrams in the draft ---------------------------------------------

def greedy_paths(target: Path, prompts: list[list[int]], n: int, threads: int) -> list[list[int]]:
    model = Model(target)
    out = []
    for p in prompts:
        eng = Engine(Context(model, n_ctx=len(p) + n + 8, n_threads=threads))
        out.append(p[-1:] + eng.generate(p, SamplingParams(max_tokens=n)))
    return out


def greedy_bigram_draft(paths: list[list[int]], accept: float, out: Path) -> Path:
    """The paths' bigrams (the first successor of each token, `accept` of them) in the Markov head;
    the draft's vocabulary holds the paths' tokens, so W2 is small."""
    tokens = sorted({t for path in paths for t in path})
    vd = max(RANK, len(tokens))
    rest = [t for t in range(SHAPE.n_vocab) if t not in set(tokens)][: vd - len(tokens)]
    d2t = np.array(tokens + rest, dtype=np.int64)
    draft_id = {int(t): i for i, t in enumerate(d2t)}
    rng = np.random.default_rng(0)
    pairs: dict[int, int] = {}
    for path in paths:
        for a, b in zip(path, path[1:]):
            if a not in pairs and len(pairs) < RANK and rng.random() < accept:
                pairs[a] = b
    w1 = np.zeros((SHAPE.n_vocab, RANK), np.float32)
    w2 = np.zeros((vd, RANK), np.float32)
    for r, (a, b) in enumerate(pairs.items()):
        w1[a, r] = 1.0
        w2[draft_id[b], r] = 30.0
    return markov_draft(out, d2t, w1, w2)


def run_greedy(args: argparse.Namespace) -> None:
    target = qwen3_0_6b(args.dtype)
    tok = Tokenizer.from_gguf(target)
    texts = prompt_texts("humaneval", args.n_prompts)
    prompts = [tok.encode(t, add_special=False) for t in texts]
    paths = greedy_paths(target, prompts, args.max_tokens, args.threads)
    draft = greedy_bigram_draft(paths, args.accept, RESULTS / f"planted-draft-{args.dtype}-{args.accept}.gguf")
    row = compare(target, draft, prompts, max_tokens=args.max_tokens, n_threads=args.threads)[0]
    print(f"{target.name} + planted draft (accept {args.accept}); {len(prompts)} prompts, {args.max_tokens} tokens, "
          f"threads={args.threads}")
    print_table(SPEC_HEADERS, [spec_cells(row)])
    if not args.no_llama_cpp:
        bin_dir = llama_cpp_build.bin_dir()
        base = llama_cpp_decode_speed(bin_dir, target, None, texts, args.max_tokens, args.threads)
        spec = llama_cpp_decode_speed(bin_dir, target, draft, texts, args.max_tokens, args.threads)
        print()
        print_table(["program", "target-only t/s", "speculative t/s", "speedup"],
                    [["dspark-ggml", round(row.target_tok_s, 1), round(row.spec_tok_s, 1), round(row.speedup, 2)],
                     ["llama.cpp", round(base, 1), round(spec, 1), round(spec / base, 2)],
                     ["ratio", round(row.target_tok_s / base, 2), round(row.spec_tok_s / spec, 2), ""]])


# ---- sampled: a bigram target and a draft that knows it -------------------------------------------

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


def bigram_target(src: Path, plan: BigramPlan, context: float, out: Path) -> Path:
    reader = gguf.GGUFReader(src)
    tensors: dict[str, object] = {"token_embd.weight": _q8_0(plan.embedding()), "output.weight": _q8_0(plan.head()),
                                  "output_norm.weight": np.ones(plan.n_embd, np.float32)}
    for t in reader.tensors:
        if t.name.endswith(("attn_output.weight", "ffn_down.weight")):
            if t.tensor_type != gguf.GGMLQuantizationType.Q8_0:
                raise SystemExit(f"{src} is not q8_0 ({t.name} is {t.tensor_type.name})")
            tensors[t.name] = _scaled_q8_0(t.data, context)
    return rewrite_gguf(src, out, tensors=tensors)


def support_tokens(prompts: list[list[int]], n_vocab: int) -> np.ndarray:
    """The prompts' own tokens first (so the text is made of familiar pieces), then others."""
    seen = list(dict.fromkeys(t for p in prompts for t in p))[:SUPPORT]
    rest = [t for t in range(1000, n_vocab) if t not in set(seen)][: SUPPORT - len(seen)]
    return np.array(sorted(seen + rest), dtype=np.int64)


def run_sampled(args: argparse.Namespace) -> None:
    base = qwen3_0_6b("q8_0")
    tok = Tokenizer.from_gguf(base)
    prompts = [tok.encode(t, add_special=False) for t in prompt_texts("humaneval", args.n_prompts)]
    plan = BigramPlan(SHAPE.n_vocab, SHAPE.n_embd, support_tokens(prompts, SHAPE.n_vocab))
    target = cached_model(f"planted-bigram-target-{args.n_prompts}-{args.context}.gguf",
                          lambda p: bigram_target(base, plan, args.context, p))
    # bias(next | cur) = W2[next] . W1[cur] = b_next . a_cur / rms: the target's logit
    draft = cached_model(f"planted-bigram-draft-{args.n_prompts}.gguf",
                         lambda p: markov_draft(p, plan.support, plan.a, plan.b / plan.rms))
    rows = compare(target, draft, prompts, temperatures=args.temperatures, draft_modes=["greedy", "probabilistic"],
                   max_tokens=args.max_tokens, n_threads=args.threads,
                   backend_sampling=[s == "backend" for s in args.sampling])
    print(f"{target.name} + {draft.name}; {len(prompts)} prompts, {args.max_tokens} tokens, threads={args.threads}")
    print_table(SPEC_HEADERS, [spec_cells(r) for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    both = argparse.ArgumentParser(add_help=False)
    both.add_argument("--n-prompts", type=int, default=3)
    both.add_argument("--max-tokens", type=int, default=64)
    both.add_argument("--threads", type=int, default=2)
    sub = ap.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("greedy", parents=[both], help="the target's greedy bigrams planted in the draft; vs llama.cpp")
    g.add_argument("--dtype", default="q8_0", choices=["f16", "q8_0", "q4_0"])
    g.add_argument("--accept", type=float, default=1.0, help="fraction of the greedy bigrams planted")
    g.add_argument("--no-llama-cpp", action="store_true")
    s = sub.add_parser("sampled", parents=[both], help="a planted bigram target and a draft that knows it")
    s.add_argument("--context", type=float, default=0.01,
                   help="scale of the layers' writes to the residual stream (0: a pure bigram model)")
    s.add_argument("--temperatures", type=float, nargs="+", default=[0.7])
    s.add_argument("--sampling", nargs="+", choices=("host", "backend"), default=["host"],
                   help="where the target's verify rows are sampled; both: side by side")
    args = ap.parse_args()
    (run_greedy if args.mode == "greedy" else run_sampled)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
