"""`dspark-ggml check TARGET.gguf DRAFT.gguf`: is the draft converted right? (see check.py)"""
from __future__ import annotations

import argparse
import json
import sys

from ..check import check_draft, verdict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET.gguf")
    p.add_argument("draft", metavar="DRAFT.gguf")
    p.add_argument("-n", "--max-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    rows = check_draft(args.target, args.draft, max_tokens=args.max_tokens, n_threads=args.threads)
    warning = verdict(rows)
    if args.json:
        print(json.dumps({"rows": [vars(r) for r in rows], "warning": warning}))
    else:
        print(f"{'variant':<22} {'tau':>6} {'acceptance':>10}")
        for r in rows:
            print(f"{r.variant:<22} {r.tau:>6.2f} {r.acceptance:>10.3f}")
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
        return 3
    return 0
