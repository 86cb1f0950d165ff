"""Shared helpers: seeding, threads, timing, token streams."""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import numpy as np
import torch


def step_parser(seed: int) -> argparse.ArgumentParser:
    """A step's command line: --out (the run's folder), --seed (default ``seed``), --threads."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/demo_pair_out")
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--threads", type=int, default=1)
    return ap


def add_optimizer_args(ap: argparse.ArgumentParser, wd: float) -> None:
    """AdamW with a cosine schedule (cosine_lr): batch size, peak lr, warmup steps, weight decay."""
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--wd", type=float, default=wd)


def start_step(ap: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, "Timer", str]:
    """Parse the command line, set torch's threads and seeds: the arguments, a timer started now and
    the target's folder (OUT/target)."""
    args = ap.parse_args(argv)
    setup_torch(args.threads, args.seed)
    return args, Timer(), os.path.join(args.out, "target")


def target_tokenizer(tdir: str):
    """The target's tokenizer (tokenizers.Tokenizer) from its folder."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))


def setup_torch(threads: int, seed: int) -> None:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.set_flush_denormal(True)
    seed_all(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Timer:
    def __init__(self):
        self.t0 = time.time()

    def __call__(self) -> float:
        return time.time() - self.t0


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def cosine_lr(step: int, total: int, warmup: int, peak: float, floor_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    prog = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + np.cos(np.pi * prog)))
