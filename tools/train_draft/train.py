"""Train a DSpark draft for a llama / qwen3 / qwen2 target from its GGUF, in one command.

    python tools/train_draft/train.py --target TARGET.gguf --out OUT_DIR [--resume] [--overwrite]

Stages (README.md): prompts -> generate -> capture -> train -> calibrate -> export -> convert ->
evaluate. Each finished stage is recorded in OUT/run.json; --resume continues an interrupted run
at the stage (and, within generate / capture / train, at the shard, sequence or checkpoint) where
it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gguf_target as gt  # noqa: E402
from data import (KINDS, capture, generate, log, open_dataset, read_json, write_json)  # noqa: E402
from draft_model import DraftConfig, count_params, feature_layer_ids  # noqa: E402
from gguf_target import RecipeError  # noqa: E402

STAGES = ("prompts", "generate", "capture", "train", "calibrate", "export", "convert", "evaluate")
# options a resumed run may change; every other one must be what the interrupted run used
RESUME_OVERRIDABLE = {"threads", "resume", "overwrite", "stop_after", "eval_prompts", "eval_tokens",
                      "eval_target", "ckpt_every", "max_draft_mb", "gen_minutes", "train_minutes",
                      "train_dtype"}
EVAL_DIR = HERE.parents[2] / "shared" / "data" / "prompts"  # only read to check disjointness


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target GGUF (llama, qwen3 or qwen2): it generates "
                    "the data and is the teacher, so take the file the draft will run with")
    ap.add_argument("--out", required=True, help="output folder (refused if it exists, unless --resume "
                    "or --overwrite)")
    ap.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    ap.add_argument("--overwrite", action="store_true", help="delete --out first if it exists")
    ap.add_argument("--data", help="reuse a finished data folder (another run's OUT/data): skips the "
                    "prompts, generate and capture stages")
    ap.add_argument("--stop-after", choices=STAGES, help="stop after this stage (resume later)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="CPU threads for torch and the runtime (default: every core)")
    ap.add_argument("--seed", type=int, default=1234)
    g = ap.add_argument_group("data")
    g.add_argument("--prompts", type=int, default=3000, help="training-style prompts built (about 6%% "
                   "go to calibration, 3%% to the quick evaluation)")
    g.add_argument("--max-new", type=int, default=256, help="new tokens per answer at most")
    g.add_argument("--max-prompt", type=int, default=384, help="longer prompts (chat-templated tokens) are skipped")
    g.add_argument("--sampled-per-prompt", type=int, default=1, help="sampled answers per prompt, "
                   "besides the greedy one")
    g.add_argument("--temp-min", type=float, default=0.7)
    g.add_argument("--temp-max", type=float, default=1.0)
    g.add_argument("--gen-minutes", type=float, default=70.0, help="stop generating after this much "
                   "generation time (the prompts are shuffled: a balanced prefix); 0 = no limit")
    g.add_argument("--gen-seqs", type=int, default=32, help="sequences per generation batch (n_seq_max)")
    g.add_argument("--gen-shard", type=int, default=128, help="requests per generation shard (the resume unit)")
    g.add_argument("--features", type=int, default=4, help="target layers the draft reads")
    g.add_argument("--capture-batch", type=int, default=1024, help="tokens per capture decode")
    g = ap.add_argument_group("draft")
    g.add_argument("--layers", type=int, default=2, help="draft decoder layers (the target's width)")
    g.add_argument("--block-size", type=int, default=8)
    g.add_argument("--markov-rank", type=int, default=64)
    g.add_argument("--init", choices=("last", "first", "random"), default="last",
                   help="draft layers start as copies of the target's last or first layers, or random")
    g.add_argument("--mask-token-id", type=int, help="the draft's MASK token (default: a spare control token)")
    g.add_argument("--vocab-coverage", type=float, default=0.99, help="draft vocabulary: the most frequent "
                   "answer tokens covering this share of them")
    g.add_argument("--draft-vocab", type=int, help="draft vocabulary size instead of --vocab-coverage")
    g.add_argument("--max-draft-vocab", type=int, default=8192)
    g = ap.add_argument_group("training")
    g.add_argument("--steps", type=int, default=6000, help="training steps at most")
    g.add_argument("--train-minutes", type=float, default=55.0, help="train for this much time over "
                   "all sessions (at most --steps steps); the cosine runs on the time spent; 0 = no limit")
    g.add_argument("--batch", type=int, default=8, help="sequences per step")
    g.add_argument("--train-dtype", choices=("auto", "bf16", "f32"), default="auto",
                   help="the draft layers' training precision (heads and loss stay f32); auto = bf16 where "
                   "the CPU has bf16 dot products (AVX-512 BF16 or AMX), else f32")
    g.add_argument("--anchors", type=int, default=32, help="anchors (blocks) per sequence")
    g.add_argument("--lr", type=float, default=2e-3)
    g.add_argument("--warmup", type=int, default=50)
    g.add_argument("--wd", type=float, default=0.01)
    g.add_argument("--ckpt-every", type=int, default=100)
    g.add_argument("--calib-anchors", type=int, default=32)
    g = ap.add_argument_group("export and evaluation")
    g.add_argument("--outtype", choices=("q8_0", "f16", "f32"), default="q8_0")
    g.add_argument("--max-draft-mb", type=float, default=20.0, help="refuse a draft GGUF larger than this")
    g.add_argument("--eval-prompts", type=int, default=16)
    g.add_argument("--eval-tokens", type=int, default=128)
    g.add_argument("--eval-target", help="GGUF the quick evaluation runs with (default: --target)")
    return ap


# ----------------------------------------------------------------------------------------------


def check_args(a, info) -> None:
    if not 2 <= a.block_size <= 16:
        raise RecipeError(f"--block-size {a.block_size} does not fit: this recipe trains blocks of 2 .. 16 "
                          "(the runtime reads 2 .. 64)")
    if a.block_size + 1 > a.max_new:
        raise RecipeError(f"--block-size {a.block_size} does not fit answers of --max-new {a.max_new} tokens")
    if not 1 <= a.layers <= info.n_layer:
        raise RecipeError(f"--layers {a.layers}: the target has {info.n_layer} layers")
    if not 1 <= a.features <= min(8, info.n_layer):
        raise RecipeError(f"--features {a.features}: 1 .. {min(8, info.n_layer)}")
    if a.draft_vocab is not None and (not 32 <= a.draft_vocab <= info.vocab_size or a.draft_vocab % 8):
        raise RecipeError(f"--draft-vocab {a.draft_vocab} does not fit: a multiple of 8 in 32 .. "
                          f"{info.vocab_size} (the target's vocabulary; our runtime aborts on a draft "
                          "vocabulary that is not a multiple of 8)")
    if not 0.5 <= a.vocab_coverage <= 1.0:
        raise RecipeError(f"--vocab-coverage {a.vocab_coverage}: 0.5 .. 1.0")
    if a.max_draft_vocab > info.vocab_size:
        a.max_draft_vocab = info.vocab_size
    if a.max_draft_vocab < 32:
        raise RecipeError("--max-draft-vocab must be >= 32")
    if a.markov_rank < 1:
        raise RecipeError("--markov-rank must be >= 1 (DSpark's Markov head)")
    if a.prompts < 8:
        raise RecipeError("--prompts must be >= 8")
    if not 0.0 < a.temp_min <= a.temp_max:
        raise RecipeError("--temp-min / --temp-max: 0 < min <= max")


def tokenizer_bytes(reader) -> int:
    """Bytes the tokenizer metadata takes in a GGUF (a converted draft carries its target's)."""
    total = 0
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        f = reader.fields.get(key)
        if f is not None:
            total += sum(int(reader.fields[key].parts[i].nbytes) + 8 for i in f.data)
    return total


def estimate_gguf_mb(info, a, vd: int, tok_bytes: int = 0) -> float:
    E, F, r = info.n_embd, info.n_ff, a.markov_rank
    H, Hk, D = info.n_head, info.n_head_kv, info.head_dim
    layer = E * H * D * 2 + E * Hk * D * 2 + 3 * E * F
    mats = a.layers * layer + a.features * E * E + vd * E + info.vocab_size * r + vd * r
    per = {"q8_0": 34 / 32, "f16": 2, "f32": 4}[a.outtype]
    return (mats * per + 8 * vd + tok_bytes) / 1e6


class Run:
    def __init__(self, out: str, args: dict):
        self.out = out
        self.path = os.path.join(out, "run.json")
        self.state = read_json(self.path) if os.path.exists(self.path) else {
            "args": args, "stages": {}, "sessions": []}

    def done(self, stage: str) -> bool:
        return stage in self.state["stages"]

    def record(self, stage: str, result: dict, seconds: float, cpu_seconds: float = 0.0) -> None:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        self.state["stages"][stage] = {"seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
                                       "peak_rss_mb_so_far": round(rss, 1), **result}
        self.save()

    def save(self) -> None:
        write_json(self.path, self.state)


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    try:
        return run(ap, a)
    except RecipeError as e:
        print(f"train_draft: error: {e}", file=sys.stderr)
        return 2


def run(ap, a) -> int:
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    out = os.path.abspath(a.out)
    if a.resume and a.overwrite:
        raise RecipeError("--resume and --overwrite contradict each other")
    if os.path.exists(out) and not (a.resume or a.overwrite):
        raise RecipeError(f"--out {out} exists: pass --resume to continue that run or --overwrite to "
                          "start over (it is deleted)")
    if a.resume and not os.path.exists(os.path.join(out, "run.json")):
        raise RecipeError(f"--resume: {out} holds no run to resume (no run.json)")
    if a.overwrite and os.path.exists(out) and not os.path.exists(os.path.join(out, "run.json")) \
            and any(os.scandir(out)):
        raise RecipeError(f"--overwrite: {out} is not a folder this recipe wrote (no run.json); not deleting it")
    reader = gt.open_reader(a.target)
    info = gt.read_target(a.target, reader)
    args = vars(a).copy()
    if a.resume:
        saved = read_json(os.path.join(out, "run.json"))["args"]
        explicit = {k for k, v in args.items() if v != ap.get_default(k)}
        bad = [k for k in sorted(explicit | set(saved)) if k not in RESUME_OVERRIDABLE
               and k in args and args[k] != saved.get(k) and k in explicit]
        if bad:
            raise RecipeError("--resume with other options than the interrupted run: "
                              + ", ".join(f"--{k.replace('_', '-')} {args[k]} (was {saved.get(k)})" for k in bad))
        merged = dict(saved)
        merged.update({k: args[k] for k in explicit if k in RESUME_OVERRIDABLE})
        merged["resume"] = True
        for k, v in merged.items():
            setattr(a, k, v)
        args = merged
    check_args(a, info)
    tok_b = tokenizer_bytes(reader)
    smallest = estimate_gguf_mb(info, a, a.draft_vocab or 32, tok_b)
    if smallest > a.max_draft_mb:
        raise RecipeError(f"the draft does not fit: {a.layers} layers, {a.features} features and a "
                          f"{a.draft_vocab or 32}-token vocabulary already make about {smallest:.1f} MB as "
                          f"{a.outtype}, over --max-draft-mb {a.max_draft_mb}")
    if a.data:
        if not os.path.isdir(a.data):
            raise RecipeError(f"--data {a.data}: no such folder")
        open_dataset(os.path.abspath(a.data), info.n_embd)  # refuse early if nothing usable
    if a.overwrite and os.path.exists(out):
        shutil.rmtree(out)  # only now that the options are known to be good
    os.makedirs(out, exist_ok=True)
    R = Run(out, args)
    R.state["sessions"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": a.threads})
    R.state["target"] = {"path": info.path, "bytes": os.path.getsize(a.target), "arch": info.arch,
                         "n_layer": info.n_layer, "n_embd": info.n_embd, "vocab": info.vocab_size}
    R.save()
    data_dir = os.path.abspath(a.data) if a.data else os.path.join(out, "data")
    capture_ids = feature_layer_ids(info.n_layer, a.features)
    mask_id = gt.choose_mask_token(info, a.mask_token_id)
    log(f"target {info.arch}: {info.n_layer} layers, width {info.n_embd}, vocab {info.vocab_size}; draft reads "
        f"layer inputs {capture_ids}, MASK token {mask_id}")
    emb, head, fnorm = gt.head_weights(reader, info)

    def stage(name, fn):
        if R.done(name):
            log(f"[{name}] done earlier")
            if a.stop_after == name:
                raise SystemExit(0)
            return R.state["stages"][name]
        log(f"[{name}]")
        t0, c0 = time.time(), time.process_time()
        res = fn()
        R.record(name, res, time.time() - t0, time.process_time() - c0)
        if a.stop_after == name:
            log(f"stopping after {name} (--stop-after); continue with --resume")
            raise SystemExit(0)
        return R.state["stages"][name]

    # ---- data --------------------------------------------------------------------------------
    prompts_path = os.path.join(data_dir, "prompts.jsonl")
    if a.data:
        prompts = [json.loads(line) for line in open(prompts_path)] if os.path.exists(prompts_path) else []
        for s in ("prompts", "generate", "capture"):
            if not R.done(s):
                R.record(s, {"reused": data_dir}, 0.0)
    else:
        os.makedirs(data_dir, exist_ok=True)

        def do_prompts():
            from prompts import build_prompts, check_disjoint

            ps = build_prompts(a.prompts, a.seed)
            hits = check_disjoint(ps, str(EVAL_DIR))
            if hits:
                raise RecipeError(f"{hits} built prompts repeat evaluation prompts of {EVAL_DIR}")
            with open(prompts_path + ".tmp", "w") as f:
                for p in ps:
                    f.write(json.dumps(p) + "\n")
            os.replace(prompts_path + ".tmp", prompts_path)
            cnt = {f"{k}_{s}": sum(1 for p in ps if p["kind"] == k and p["split"] == s)
                   for k in KINDS for s in ("train", "calib", "eval")}
            return {"n": len(ps), "eval_overlap": hits, **cnt}

        stage("prompts", do_prompts)
        prompts = [json.loads(line) for line in open(prompts_path)]
        stage("generate", lambda: generate(
            a.target, data_dir, prompts, max_new=a.max_new, max_prompt=a.max_prompt,
            sampled_per_prompt=a.sampled_per_prompt, t_lo=a.temp_min, t_hi=a.temp_max,
            n_seq_max=a.gen_seqs, threads=a.threads, shard_size=a.gen_shard,
            max_minutes=a.gen_minutes or None))
        stage("capture", lambda: capture(
            a.target, data_dir, prompts, capture_ids=capture_ids, n_embd=info.n_embd, threads=a.threads,
            n_batch=a.capture_batch, n_seq_max=16))
    ds = open_dataset(data_dir, info.n_embd)
    if ds.capture_ids != capture_ids:
        raise RecipeError(f"data folder {data_dir} captured layer inputs {ds.capture_ids}, this run needs "
                          f"{capture_ids} (--features {a.features})")

    # ---- draft -------------------------------------------------------------------------------
    from training import (bf16_is_fast, choose_vocab, draft_on_split, init_draft,
                          sequential_temperature_scaling, train)

    vocab_path = os.path.join(out, "train", "vocab.npy")
    if os.path.exists(vocab_path):
        vocab_ids = np.load(vocab_path)
        cover = R.state.get("vocab", {}).get("coverage", float("nan"))
    else:
        eog = [info.eos_id] + [i for i, t in info.token_texts.items() if t in ("<|im_end|>", "<|eot_id|>",
                                                                               "<|endoftext|>")]
        fits = 32
        while fits + 64 <= info.vocab_size and estimate_gguf_mb(info, a, fits + 64, tok_b) <= a.max_draft_mb:
            fits += 64
        limit = min(a.max_draft_vocab, fits)
        vocab_ids, cover, wanted = choose_vocab(ds, info.vocab_size, a.vocab_coverage, a.draft_vocab, limit, eog)
        if a.draft_vocab is None and wanted > len(vocab_ids):
            log(f"draft vocabulary: {a.vocab_coverage:.1%} coverage wants {wanted} tokens; capped at "
                f"{len(vocab_ids)} ({'--max-draft-vocab' if limit == a.max_draft_vocab else '--max-draft-mb'})")
        os.makedirs(os.path.dirname(vocab_path), exist_ok=True)
        np.save(vocab_path, vocab_ids)
        R.state["vocab"] = {"draft_vocab_size": int(len(vocab_ids)), "coverage": cover,
                            "wanted_for_coverage": int(wanted)}
    est = estimate_gguf_mb(info, a, len(vocab_ids), tok_b)
    R.state.setdefault("vocab", {})["estimated_gguf_mb"] = round(est, 2)
    R.save()
    if est > a.max_draft_mb:
        raise RecipeError(f"the draft does not fit: about {est:.1f} MB as {a.outtype} with a {len(vocab_ids)}-token "
                          f"vocabulary and {a.layers} layers, over --max-draft-mb {a.max_draft_mb}")
    log(f"draft vocabulary: {len(vocab_ids)} tokens covering {cover:.4f} of the training answers; "
        f"GGUF about {est:.1f} MB")
    cfg = DraftConfig(vocab_size=info.vocab_size, draft_vocab_size=int(len(vocab_ids)), hidden_size=info.n_embd,
                      intermediate_size=info.n_ff, num_hidden_layers=a.layers, num_attention_heads=info.n_head,
                      num_key_value_heads=info.n_head_kv, head_dim=info.head_dim, rms_norm_eps=info.rms_eps,
                      rope_theta=info.rope_theta, capture_ids=capture_ids, num_target_layers=info.n_layer,
                      block_size=a.block_size, mask_token_id=mask_id, markov_rank=a.markov_rank)
    draft = init_draft(cfg, reader, info, vocab_ids, emb, head, fnorm, a.init, a.seed + 7)
    R.state["draft"] = {"config": cfg.to_dict(), "params_total": count_params(draft),
                        "params_trainable": count_params(draft, True)}
    R.save()
    train_dir = os.path.join(out, "train")
    tr = stage("train", lambda: train(
        draft, ds, train_dir=train_dir, steps=a.steps, batch=a.batch, anchors=a.anchors,
        lr=a.lr, warmup=a.warmup, wd=a.wd, seed=a.seed + 11, ckpt_every=a.ckpt_every, resume=True,
        max_minutes=a.train_minutes or None,
        bf16_body=a.train_dtype == "bf16" or (a.train_dtype == "auto" and bf16_is_fast())))
    if "history" in tr:  # trained (now or earlier): load the final weights
        st = torch.load(os.path.join(train_dir, "ckpt.pt"), weights_only=False)
        draft.load_state_dict({**draft.state_dict(), **st["model"]}, strict=True)
    draft.eval()

    def do_calibrate():
        z, acc, val = draft_on_split(draft, ds, "calib", a.calib_anchors, a.batch, a.seed + 13)
        res = sequential_temperature_scaling(z, acc, val)
        log(f"calibrate: {res['rows']} blocks; temperatures {res['temperatures']}; ECE raw {res['ece_raw']} -> "
            f"{res['ece_calibrated']}; τ (torch, greedy chain) {res['tau_greedy_torch']}")
        return res

    cal = stage("calibrate", do_calibrate)

    from export import convert_draft, evaluate_isolated, export_speculators

    spec_dir = os.path.join(out, "speculators")
    stage("export", lambda: {"dir": export_speculators(draft, info, spec_dir, cal, os.path.basename(a.target))})
    gguf_path = os.path.join(out, f"draft-{a.outtype}.gguf")

    def do_convert():
        stub = gt.write_hf_stub(reader, info, os.path.join(out, "target_hf"), emb, head)
        res = convert_draft(spec_dir, stub, gguf_path, a.outtype, info.tokenizer_pre)
        mb = res["bytes"] / 1e6
        if mb > a.max_draft_mb:
            raise RecipeError(f"the converted draft is {mb:.1f} MB, over --max-draft-mb {a.max_draft_mb}")
        log(f"convert: {gguf_path} ({mb:.2f} MB)")
        return res

    stage("convert", do_convert)

    def do_evaluate():
        import dspark_ggml as dg

        target = a.eval_target or a.target
        ev = [p for p in prompts if p.get("split") == "eval"]
        by_kind = {k: [p for p in ev if p["kind"] == k] for k in KINDS}
        chosen = []
        while len(chosen) < a.eval_prompts and any(by_kind.values()):
            for k in KINDS:
                if by_kind[k] and len(chosen) < a.eval_prompts:
                    chosen.append(by_kind[k].pop(0))
        if not chosen:
            raise RecipeError("no held-out (eval split) prompts to evaluate on: raise --prompts")
        m = dg.LLM(target, n_ctx=1024, n_threads=a.threads)
        toks = [m.apply_chat_template([{"role": "user", "content": p["text"]}])[:a.max_prompt] for p in chosen]
        m.close()
        res = evaluate_isolated(target, gguf_path, toks, max_tokens=a.eval_tokens, threads=a.threads,
                                work_dir=out)
        res["target"]["path"] = target
        res["kinds"] = [p["kind"] for p in chosen]
        return res

    stage("evaluate", do_evaluate)
    R.state["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    R.save()
    log(f"done: {gguf_path}; record in {R.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
