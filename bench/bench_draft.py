"""Draft step time: one propose() of DSpark (Markov + confidence head) vs DFlash blocks of the same
length, for 1 and 8 sequences, next to the target's single-token decode, in one run.

    python bench/bench_draft.py [--threads 2] [--rank 256] [--dtype q8_0]

Models (random weights, written once into bench/results): the target is Qwen3-0.6B's shape; the
drafts have 2 layers of the target's width, block size 16, and the same backbone weights (same
seed); the DSpark one adds a vanilla Markov head of the given rank and a confidence head.
A block of B tokens proposes B tokens (DSpark, anchor-first) or B-1 (DFlash).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from common import cached_model, print_table, qwen3_0_6b, timed
from tests.tiny_models import DraftConfig, TargetConfig, write_draft

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.model import Model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--dtype", default="q8_0")
    ap.add_argument("--context", type=int, default=128, help="injected context positions per sequence")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=64, help="markov_top_k of the approximate chain column")
    args = ap.parse_args()

    tcfg = TargetConfig.qwen3_0_6b_shape(dtype=args.dtype)
    tpath = qwen3_0_6b(args.dtype)
    backbone = dict(n_layer=2, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072, block_size=16, dtype=args.dtype)
    drafts = {
        "dflash": DraftConfig(kind="dflash", **backbone),
        "dspark": DraftConfig(kind="dspark", markov_rank=args.rank, **backbone),
    }
    target = Model(tpath)
    models = {k: DraftModel(cached_model(f"draft-{k}-r{args.rank}-{args.dtype}.gguf",
                                         lambda p, c=c: write_draft(p, c, tcfg, seed=1, return_weights=False)), target)
              for k, c in drafts.items()}

    # the target's single-token decode after a prompt, for scale
    ctx = Context(target, n_ctx=args.context + 64, n_threads=args.threads)
    toks = np.random.default_rng(0).integers(0, target.n_vocab, size=args.context + 1).astype(np.int32)
    ctx.decode(toks[:args.context])
    def target_step() -> None:
        ctx.decode(toks[args.context:], [args.context])
        ctx.kv_seq_rm(0, args.context)
    t_target = timed(target_step, args.reps) * 1e3

    rows = []
    for n_seqs in (1, 8):
        feats = np.random.default_rng(1).normal(0, 1, size=(args.context, len(models["dspark"].info.target_layers) * target.n_embd)).astype(np.float32)
        ctxs = {}
        for k, m in models.items():
            dc = DraftContext(m, n_ctx=n_seqs * (args.context + 32), n_seq_max=n_seqs, n_threads=args.threads)
            for s in range(n_seqs):
                dc.inject(feats, np.arange(args.context), s)
            ctxs[k] = dc
        anchors = list(range(1, n_seqs + 1))
        for block in (8, 16):
            t = {}
            for k, dc in ctxs.items():
                n_draft = block if k == "dspark" else block - 1
                t[k] = timed(lambda dc=dc, n=n_draft: dc.propose(anchors, [args.context] * n_seqs, n_draft=n), args.reps) * 1e3
            dc = ctxs["dspark"]
            t["topk"] = timed(lambda: dc.propose(anchors, [args.context] * n_seqs, n_draft=block, markov_top_k=args.top_k),
                              args.reps) * 1e3
            rows.append([block, n_seqs, round(t["dflash"], 2), round(t["dspark"], 2),
                         f"{100 * (t['dspark'] / t['dflash'] - 1):+.1f}%", round(t["topk"], 2),
                         f"{100 * (t['topk'] / t['dflash'] - 1):+.1f}%", round(t_target, 2)])
    print(f"threads={args.threads} dtype={args.dtype} markov_rank={args.rank} context={args.context}")
    print_table(["block", "seqs", "DFlash step ms", "DSpark exact ms", "Markov+conf cost",
                 f"DSpark top-{args.top_k} ms", "Markov+conf cost (top-k)", "target 1-token decode ms"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
