"""`dspark-ggml quantize IN.gguf OUT.gguf TYPE`: llama-quantize's types and mixtures (see ../quantize.py)."""
from __future__ import annotations

import argparse
import sys

from ..quantize import FILE_TYPES, ALIASES, QuantizeSummary, ggml_type_name, quantize_gguf


def _types_help() -> str:
    names = ", ".join(FILE_TYPES)
    aliases = ", ".join(f"{a} = {b}" for a, b in ALIASES.items())
    return f"output type, any case, or its LLAMA_FTYPE number: {names} (aliases: {aliases})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="IN.gguf", help="the model to quantize")
    p.add_argument("output", metavar="OUT.gguf", help="the file to write (replaced if it exists)")
    p.add_argument("type", metavar="TYPE", help=_types_help())
    p.add_argument("--allow-requantize", action="store_true",
                   help="also convert tensors that are already quantized (loses quality compared with "
                        "quantizing from f32/f16/bf16)")
    p.add_argument("--pure", action="store_true",
                   help="no mixture: every convertible matrix gets TYPE's base type (block-size fallbacks "
                        "still apply)")
    p.add_argument("-t", "--threads", type=int, default=None, help="worker threads (default: all CPUs)")
    p.add_argument("--dry-run", action="store_true", help="print each tensor's planned type; write nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _print_plan(s: QuantizeSummary) -> None:
    width = max((len(t.name) for t in s.tensors), default=4)
    for t in s.tensors:
        shape = "[" + ", ".join(map(str, t.shape)) + "]"
        note = "  (fallback: rows do not split into the mixture's type)" if t.fallback else ""
        src, dst = ggml_type_name(t.src_type), ggml_type_name(t.dst_type)
        print(f"{t.name:<{width}}  {shape:<18} {src:>7} -> {dst:<7}{_mib(t.dst_nbytes):>12}{note}")


def run(args: argparse.Namespace) -> int:
    if args.threads is not None and args.threads < 1:
        print("dspark-ggml quantize: error: --threads must be >= 1", file=sys.stderr)
        return 2
    s = quantize_gguf(args.input, args.output, args.type, allow_requantize=args.allow_requantize,
                      pure=args.pure, n_threads=args.threads, progress=not args.quiet, dry_run=args.dry_run)
    if args.dry_run:
        _print_plan(s)
    mixture = "pure" if s.pure else "mixture"
    verb = "would write" if args.dry_run else f"wrote {args.output}:"
    print(f"{verb} {s.file_type.name} ({mixture}, general.file_type {s.file_type.ftype}); tensor data "
          f"{_mib(s.src_bytes)} -> {_mib(s.dst_bytes)}; {s.n_converted} tensors converted, "
          f"{s.n_copied} copied" + ("" if args.dry_run else f", in {s.seconds:.1f} s"))
    if s.n_fallback:
        what = "1 tensor has rows" if s.n_fallback == 1 else f"{s.n_fallback} tensors have rows"
        print(f"note: {what} that do not split into the blocks of the type chosen for them and use a "
              f"smaller-block type instead (as llama-quantize does)", file=sys.stderr)
    return 0
