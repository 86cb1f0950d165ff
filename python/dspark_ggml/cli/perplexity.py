"""`dspark-ggml perplexity`: perplexity of a model on a text, and KL divergence from a reference
model's log-probs, as llama.cpp's `llama-perplexity` computes them (same chunks, same scored
positions, same base-file format: either program reads the other's ``--kl-divergence-base``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import InvalidArgumentError

KV_TYPES = ("f16", "f32", "bf16", "q8_0")
DEFAULT_N_CTX = 512


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", metavar="FILE.gguf", required=True, help="the model to evaluate")
    p.add_argument("-f", "--file", metavar="TEXT", dest="text_file",
                   help="the text (one final newline is dropped, as llama.cpp does); with --kl-divergence "
                        "optional: when given, its tokens must be the base file's")
    p.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, metavar="N",
                   help=f"tokens per chunk; the second half of each is scored (default: {DEFAULT_N_CTX}; "
                        "with --kl-divergence the base file's)")
    p.add_argument("-b", "--batch-size", dest="n_batch", type=int, metavar="N",
                   help="tokens per decode; N >= the context decodes N/ctx chunks side by side, a smaller N "
                        "decodes each chunk in several batches (default: the context size)")
    p.add_argument("-t", "--threads", dest="n_threads", type=int, metavar="N",
                   help="CPU threads (default: all hardware threads)")
    p.add_argument("--chunks", type=int, default=-1, metavar="N",
                   help="evaluate at most N chunks (default: -1 = all)")
    p.add_argument("--kl-divergence-base", metavar="FILE",
                   help="alone: write the log-probs of the scored positions to FILE (llama-perplexity's "
                        "format); with --kl-divergence: the file to compare against")
    p.add_argument("--kl-divergence", action="store_true",
                   help="compare the model with the log-probs in --kl-divergence-base: KL divergence, "
                        "Δp, same top token, both perplexities")
    p.add_argument("--json", action="store_true", help="print one JSON object (probabilities as fractions)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g = p.add_argument_group("context")
    g.add_argument("--type-kv", choices=KV_TYPES, help="KV cache type for K and V (default: f16)")
    g.add_argument("-ctk", "--cache-type-k", dest="type_k", choices=KV_TYPES,
                   help="llama.cpp's spelling; K and V share one type here, so -ctk and -ctv must agree")
    g.add_argument("-ctv", "--cache-type-v", dest="type_v", choices=KV_TYPES, help="see -ctk")
    g.add_argument("-fa", "--flash-attn", choices=("auto", "on", "off"),
                   help="flash attention (default: auto)")
    g.add_argument("--device", type=int, metavar="INDEX",
                   help="device index (see `dspark-ggml info --system`); -1 = first GPU, else CPU "
                        "(default: -1)")
    g.add_argument("--no-mmap", action="store_true", help="copy the weights instead of mapping the file")


def _type_kv(args: argparse.Namespace) -> str:
    given = {v for v in (args.type_kv, args.type_k, args.type_v) if v is not None}
    if len(given) > 1:
        raise InvalidArgumentError(f"K and V caches share one type here: --type-kv/-ctk/-ctv disagree "
                                   f"({', '.join(sorted(given))})")
    return given.pop() if given else "f16"


def _check(args: argparse.Namespace) -> None:
    for name, flag, low in (("n_ctx", "-c/--ctx-size", 4), ("n_batch", "-b/--batch-size", 1),
                            ("n_threads", "-t/--threads", 1)):
        v = getattr(args, name)
        if v is not None and v < low:
            raise InvalidArgumentError(f"{flag} must be >= {low}, got {v}")
    if args.kl_divergence and not args.kl_divergence_base:
        raise InvalidArgumentError("--kl-divergence needs the base file: --kl-divergence-base FILE")
    if not args.kl_divergence and not args.text_file:
        raise InvalidArgumentError("no text: pass -f/--file TEXT")


def run(args: argparse.Namespace) -> int:
    from .. import perplexity as ppl_mod
    from ..model import Model

    _check(args)
    type_kv = _type_kv(args)
    text = ppl_mod.read_text(args.text_file) if args.text_file else None
    if not os.path.isfile(args.model):
        from ..errors import FileAccessError

        raise FileAccessError(f"{args.model}: no such model file")
    model_options: dict[str, Any] = {"use_mmap": not args.no_mmap}
    if args.device is not None:
        model_options["device"] = args.device
    if args.kl_divergence:  # refuse a bad base file before loading the model
        ppl_mod.BaseFile(args.kl_divergence_base).close()
    model = Model(args.model, **model_options)
    common: dict[str, Any] = dict(n_batch=args.n_batch, n_chunks=args.chunks, n_threads=args.n_threads,
                                  type_kv=type_kv, progress=False if args.no_progress else None)
    if args.flash_attn is not None:
        common["flash_attn"] = {"auto": "auto", "on": True, "off": False}[args.flash_attn]
    if args.kl_divergence:
        res = ppl_mod.kl_divergence(model, args.kl_divergence_base, text, n_ctx=args.n_ctx, **common)
        if args.json:
            print(json.dumps({"mode": "kl-divergence", "model": args.model, "base": args.kl_divergence_base,
                              **res.to_dict()}))
        else:
            _print_kld(res)
        return 0
    res_p = ppl_mod.perplexity(model, text, n_ctx=args.n_ctx or DEFAULT_N_CTX,
                               kl_divergence_base=args.kl_divergence_base, **common)
    if args.json:
        d: dict[str, Any] = {"mode": "perplexity", "model": args.model, **res_p.to_dict(),
                             "kld_mean": None, "kld_err": None, "same_top_p": None, "same_top_p_err": None}
        if args.kl_divergence_base:
            d["kl_divergence_base"] = args.kl_divergence_base
        print(json.dumps(d))
        return 0
    print(f"perplexity: {res_p.n_tokens} tokens, {res_p.n_chunk} chunks of {res_p.n_ctx} "
          f"({ppl_mod.n_scored(res_p.n_ctx)} scored per chunk), {res_p.seconds:.2f} s")
    print(",".join(f"[{i + 1}]{v:.4f}" for i, v in enumerate(res_p.chunk_ppl)) + ",")
    if args.kl_divergence_base:
        print(f"saved the log-probs of {res_p.n_chunk} chunks to {args.kl_divergence_base}")
    print(f"Final estimate: PPL = {res_p.ppl:.4f} +/- {res_p.ppl_err:.5f}")
    return 0


def _print_kld(r: Any) -> None:
    out = sys.stdout.write
    out(f"kl-divergence: {r.n_chunk} chunks of {r.n_ctx}, {r.count} scored positions, {r.seconds:.2f} s\n\n")
    out("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
        "            Same top p\n")
    for i, c in enumerate(r.chunks):
        out(f"{i + 1:4d}    {c['ppl']:9.4f} ± {c['ppl_err']:9.4f}    {c['ln_ppl_ratio']:10.5f} ± "
            f"{c['ln_ppl_ratio_err']:10.5f}    {c['kld_mean']:10.5f} ± {c['kld_err']:10.5f}    "
            f"{100 * c['rms_dp']:6.3f} ± {100 * c['rms_dp_err']:6.3f} %    {100 * c['same_top_p']:6.3f} ± "
            f"{100 * c['same_top_p_err']:6.3f} %\n")
    if r.count < 100:
        out(f"\n(only {r.count} positions: llama-perplexity prints no statistics below 100)\n")
    out("\n====== Perplexity statistics ======\n")
    out(f"Mean PPL(Q)                   : {r.ppl:10.6f} ± {r.ppl_err:10.6f}\n")
    out(f"Mean PPL(base)                : {r.ppl_base:10.6f} ± {r.ppl_base_err:10.6f}\n")
    out(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * r.ln_ppl_cor:6.2f}%\n")
    out(f"Mean ln(PPL(Q)/PPL(base))     : {r.ln_ppl_ratio:10.6f} ± {r.ln_ppl_ratio_err:10.6f}\n")
    out(f"Mean PPL(Q)/PPL(base)         : {r.ppl_ratio:10.6f} ± {r.ppl_ratio_err:10.6f}\n")
    out(f"Mean PPL(Q)-PPL(base)         : {r.ppl_diff:10.6f} ± {r.ppl_diff_err:10.6f}\n")
    out("\n====== KL divergence statistics ======\n")
    out(f"Mean    KLD: {r.kld_mean:10.6f} ± {r.kld_err:10.6f}\n")
    out(f"Maximum KLD: {r.kld_max:10.6f}\n")
    for f in (0.999, 0.99, 0.95, 0.90):
        out(f"{_pct_label(f)}   KLD: {r.kld_percentile(f):10.6f}\n")
    out(f"Median  KLD: {r.kld_median:10.6f}\n")
    for f in (0.10, 0.05, 0.01, 0.001):
        out(f"{_pct_label(f)}   KLD: {r.kld_percentile(f):10.6f}\n")
    out(f"Minimum KLD: {r.kld_min:10.6f}\n")
    out("\n====== Token probability statistics ======\n")
    out(f"Mean    Δp: {100 * r.dp_mean:6.3f} ± {100 * r.dp_err:5.3f} %\n")
    out(f"Maximum Δp: {100 * r.dp_max:6.3f}%\n")
    for f in (0.999, 0.99, 0.95, 0.90, 0.75):
        out(f"{_pct_label(f)}   Δp: {100 * r.dp_percentile(f):6.3f}%\n")
    out(f"Median  Δp: {100 * r.dp_median:6.3f}%\n")
    for f in (0.25, 0.10, 0.05, 0.01, 0.001):
        out(f"{_pct_label(f)}   Δp: {100 * r.dp_percentile(f):6.3f}%\n")
    out(f"Minimum Δp: {100 * r.dp_min:6.3f}%\n")
    out(f"RMS Δp    : {100 * r.rms_dp:6.3f} ± {100 * r.rms_dp_err:5.3f} %\n")
    out(f"Same top p: {100 * r.same_top_p:6.3f} ± {100 * r.same_top_p_err:5.3f} %\n")


def _pct_label(fraction: float) -> str:
    return f"{100 * fraction:4.1f}%"
