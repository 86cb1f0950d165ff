"""The demo pair (SmolLM2-135M-Instruct + its trained DSpark draft), measured side by side in one run.

    python bench/bench_demo.py [--n-prompts 8] [--max-tokens 128] [--threads 2] [--types ...]
                               [--no-llama-cpp] [--no-server] [--target T.gguf --draft D.gguf]

Held-out prompts from GSM8K, HumanEval and MT-Bench (../shared/data/prompts; never used to train or
calibrate the draft) through the chat template, greedy unless said otherwise, block 8. Tables:

1. per prompt set: target-only and speculative tokens/s, speedup, tau (mean accepted length,
   counting the target's token), acceptance by position, the ideal speedup the measured passes
   allow (tau * t_step / (t_draft + t_verify)) and measured / ideal; then T = 0.7 with the
   probabilistic chain (acceptance);
2. target-only tokens/s of the model in other weight types (made by our quantize): the fastest of
   them against the demo pair's speculative speed;
3. llama.cpp's llama-speculative-simple --spec-type draft-dspark on the same two files;
4. calibration of the confidence head: expected calibration error (10 bins) of the running product
   of confidences per block position against "every draft token up to here accepted", with the
   draft's calibrated temperatures and without them (the raw sigmoid);
5. the schedules on this pair: static, adaptive and confidence, tokens/s;
6. the server (bench/bench_server.py --chat) at concurrency 1, 4 and 16, with and without the draft.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import add_prompts_arg, SPEC_HEADERS, chat_prompts, decode_speed, llama_cpp_decode_speed, print_table, prompt_texts, \
    smollm2_file, spec_cells
import llama_cpp_build

import dspark_ggml as dg
from dspark_ggml import demo
from dspark_ggml.benchmark import compare

SETS = ["gsm8k", "humaneval", "mt-bench"]
OTHER_TYPES = ["f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_K", "Q4_K_M", "iq4_nl"]


def set_prompts(tok: dg.Tokenizer, name: str, n: int) -> tuple[list[str], list[list[int]]]:
    """A shared prompt set through the chat template: the texts and their token ids."""
    rendered = chat_prompts(tok, prompt_texts(name, n))
    return rendered, [tok.encode(r, add_special=False, parse_special=True) for r in rendered]


def speed_table(target: str, draft: str, tok: dg.Tokenizer, args) -> tuple[list, float]:
    rows, best = [], 0.0
    for name in SETS:
        _, prompts = set_prompts(tok, name, args.n_prompts)
        temps = [0.0, 0.7] if name == SETS[0] else [0.0]
        for r in compare(target, draft, prompts, temperatures=temps, draft_modes=["probabilistic"] if 0.7 in temps
                         else ["greedy"], max_tokens=args.max_tokens, n_threads=args.threads,
                         eog=sorted(tok.eog_ids)):
            acc = " ".join(f"{a:.2f}" for a in r.stats.acceptance_by_position)
            rows.append([name] + spec_cells(r) + [acc])
            if r.temperature == 0.0:
                best = max(best, r.spec_tok_s)
            print(rows[-1], file=sys.stderr, flush=True)
    return rows, best


def other_types(tok: dg.Tokenizer, args) -> list:
    _, prompts = set_prompts(tok, "humaneval", args.n_prompts)
    rows = []
    for t in args.types:
        rows.append([t, round(decode_speed(smollm2_file(t), prompts, args.max_tokens, args.threads), 1)])
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def ece(conf: np.ndarray, hit: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error of predicted probabilities `conf` against outcomes `hit` (0/1):
    per bin, its share of the samples times |mean confidence - mean outcome|, summed."""
    if len(conf) == 0:
        return float("nan")
    idx = np.minimum((conf * bins).astype(int), bins - 1)
    gap = np.bincount(idx, weights=conf, minlength=bins) - np.bincount(idx, weights=hit, minlength=bins)
    return float(np.abs(gap).sum() / len(conf))


def calibration(target: str, draft: str, tok: dg.Tokenizer, args) -> list:
    """Per block position k: ECE of prod_{j<=k} c_j against "slots 0..k all match the target's greedy
    tokens", from the draft's calibrated confidences and from the raw ones (T_j = 1)."""
    import gguf

    model = dg.Model(target)
    dmodel = dg.DraftModel(draft, model)
    field = gguf.GGUFReader(draft).fields.get("dflash.confidence_temperatures")
    temps = np.array(field.contents() if field else [1.0] * dmodel.info.max_draft, np.float64)
    layers = dmodel.info.target_layers
    cal, raw, hits = [], [], []
    for name in SETS:
        _, prompts = set_prompts(tok, name, args.n_prompts)
        with dg.LLM(target, n_ctx=1024, n_threads=args.threads) as llm:
            answers = [llm.generate(p, max_tokens=args.max_tokens).tokens for p in prompts]
        ctx = dg.Context(model, n_ctx=1024, n_threads=args.threads)
        ctx.set_capture_layers(layers)
        for p, a in zip(prompts, answers):
            seq = list(p) + list(a)
            ctx.kv_clear()
            ctx.decode(seq, outputs=[False] * (len(seq) - 1) + [True])
            feats = ctx.get_captured(copy=True)
            # as the engine drafts: the context's features injected up to the anchor, the anchor (the
            # last committed token) at its position, slot k guessing the token after it + k
            dctx = dg.DraftContext(dmodel, n_ctx=1024, n_threads=args.threads)
            done = 0
            for anchor in range(len(p), len(seq) - 1, 4):
                dctx.inject(feats[done:anchor], np.arange(done, anchor))
                done = anchor
                prop = dctx.propose([seq[anchor]], [anchor])
                c = np.asarray(prop.confidence[0], np.float64)
                want = seq[anchor + 1: anchor + 1 + len(c)]
                k = len(want)
                ok = np.cumprod(np.asarray(prop.tokens[0][:k]) == np.asarray(want))
                logit = np.log(c[:k]) - np.log1p(-c[:k])
                cal.append(np.cumprod(c[:k]))
                raw.append(np.cumprod(1.0 / (1.0 + np.exp(-logit * temps[:k]))))
                hits.append(ok)
            dctx.close()
        ctx.close()
    rows = []
    for pos in range(int(max(len(h) for h in hits))):
        pick = [i for i, h in enumerate(hits) if len(h) > pos]
        h = np.array([hits[i][pos] for i in pick], np.float64)
        rows.append([pos + 1, len(pick), round(float(h.mean()), 3),
                     round(ece(np.array([raw[i][pos] for i in pick]), h), 4),
                     round(ece(np.array([cal[i][pos] for i in pick]), h), 4)])
    return rows


def schedules(target: str, draft: str, tok: dg.Tokenizer, args) -> list:
    _, prompts = set_prompts(tok, "humaneval", args.n_prompts)
    rows = []
    for schedule in ("none", "static", "adaptive", "confidence"):
        spec = dg.SpeculativeConfig(method="none") if schedule == "none" else dg.SpeculativeConfig(schedule=schedule)
        tok_s = decode_speed(target, prompts, args.max_tokens, args.threads,
                             draft=None if schedule == "none" else draft, speculative=spec)
        rows.append([schedule, round(tok_s, 1)])
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--target", help="target GGUF (default: the demo's)")
    ap.add_argument("--draft", help="draft GGUF (default: the demo's)")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="*", default=OTHER_TYPES, help="weight types for table 2")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--only", nargs="*", default=["speed", "types", "llama", "calibration", "schedules", "server"])
    args = ap.parse_args()
    target = args.target or demo.target_path()
    draft = args.draft or demo.DRAFT_PATH
    tok = dg.Tokenizer.from_gguf(target)
    print(f"{Path(target).name} + {Path(draft).name}; {args.n_prompts} prompts per set through the chat template, "
          f"{args.max_tokens} tokens, threads={args.threads}", flush=True)

    best_spec = 0.0
    if "speed" in args.only:
        rows, best_spec = speed_table(target, draft, tok, args)
        print_table(["set"] + SPEC_HEADERS + ["acceptance by position"], rows)
    if "types" in args.only:
        rows = other_types(tok, args)
        print("\ntarget-only in other weight types (HumanEval prompts)")
        print_table(["type", "target-only t/s"], rows)
        fastest = max(rows, key=lambda r: r[1])
        if best_spec:
            print(f"fastest target-only: {fastest[0]} {fastest[1]} t/s; the demo pair speculative (best set): "
                  f"{best_spec:.1f} t/s = {best_spec / fastest[1]:.2f}x")
    if "llama" in args.only and not args.no_llama_cpp:
        bin_dir = llama_cpp_build.bin_dir()
        rendered, prompts = set_prompts(tok, "humaneval", args.n_prompts)
        ours = decode_speed(target, prompts, args.max_tokens, args.threads, draft=draft,
                            speculative=dg.SpeculativeConfig(n_max=8))
        theirs = llama_cpp_decode_speed(bin_dir, Path(target), Path(draft), rendered, args.max_tokens, args.threads)
        print("\nspeculative, HumanEval through the chat template, greedy, n_max 8")
        print_table(["program", "tokens/s"], [["dspark-ggml", round(ours, 1)], ["llama-speculative-simple", round(theirs, 1)],
                                              ["ratio", round(ours / theirs, 2)]])
    if "calibration" in args.only:
        rows = calibration(target, draft, tok, args)
        print("\ncalibration of the running product of confidences (10-bin ECE), all three sets")
        print_table(["position", "blocks", "all accepted", "ECE raw", "ECE calibrated"], rows)
    if "schedules" in args.only:
        print("\nschedules (HumanEval, one sequence)")
        print_table(["schedule", "tokens/s"], schedules(target, draft, tok, args))
    if "server" in args.only and not args.no_server:
        cmd = [sys.executable, str(Path(__file__).with_name("bench_server.py")), "--chat", "--prompts", "humaneval", "-m", target,
               "-md", draft, "--max-tokens", str(args.max_tokens), "--threads", "1"]
        print("\nserver: " + " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
