"""Long GGUF fuzzing runs: mutants of tiny models of every architecture and draft kind and of the
demo pair (tests/gguf_mutate.py), each loaded and run in a worker subprocess with a memory and
time limit (tests/gguf_fuzz.py). Prints the outcome counts; crashes and hangs are saved with their
seed and index.

    python tools/fuzz_gguf.py --n 20000 [--seed 1] [--hf-archs] [--extra FILE.gguf[:TARGET.gguf] ...]

--hf-archs adds the Gemma-4 and Qwen3-MoE test targets (tiny transformers checkpoints converted by
our converter; needs torch and transformers). --extra adds any GGUF (a target, or a draft with its
target), e.g. one written by llama.cpp's convert_hf_to_gguf.py. Exit status 1 when anything
crashed, hung or raised a non-DSparkError.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fuzzer is test tooling: tests/gguf_fuzz.py, imported as the tests do
from tests.gguf_fuzz import Base, default_bases, run  # noqa: E402


def _extra(spec: str) -> Base:
    path, _, target = spec.partition(":")
    return Base(Path(path), "draft", Path(target)) if target else Base(Path(path), "target")


def _hf_arch_bases(directory: Path) -> list[Base]:
    sys.path.insert(0, str(ROOT / "tests"))  # tests/new_archs.py imports its sibling hf_checkpoints by that name
    from new_archs import CASES, converted

    return [Base(converted(directory, case)[1], "target") for case in CASES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="mutants in all, spread over the base files")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra", action="append", default=[], metavar="FILE[:TARGET]")
    ap.add_argument("--hf-archs", action="store_true", help="also the Gemma-4 and Qwen3-MoE test targets")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz", help="where failures are saved")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one mutant may take")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        bases = default_bases(Path(d)) + [_extra(s) for s in args.extra]
        if args.hf_archs:
            bases += _hf_arch_bases(Path(d))
        t0 = time.perf_counter()
        report = run(bases, -(-args.n // len(bases)), args.seed, args.out, timeout_s=args.timeout)
        print(report.summary())
        print(f"{len(bases)} base files, seed {args.seed}, {time.perf_counter() - t0:.0f} s")
    return 1 if report.failures or report.pyerrors else 0


if __name__ == "__main__":
    sys.exit(main())
