"""Data stages: the target answers its prompts (generate), then our runtime captures the draft's
features over prompt + answer (capture). Torch never runs the target.

Layout of a data folder (DATA = OUT/data unless --data names another):

    prompts.jsonl          every prompt with its id, kind and split (train / calib / eval)
    gen/shard_NNNNN.jsonl  answers, one request per line (prompt tokens, answer tokens, T, seed)
    gen/done.json          generation finished (counts, tokens/s)
    index.npz              the sequences captured: flat tokens, loss mask (1 = answer token),
                           offsets, lengths, split and kind per sequence
    feats.f16              memmap [T, n_feat * E] fp16: residual streams entering the capture ids
    final.f16              memmap [T, E] fp16: the input of the target's final norm
    lse.f32                memmap [T] f32: log-sum-exp of the target logits (answer positions)
    capture.json           capture progress (sequences done), then capture ids, sizes, tokens/s
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from gguf_target import RecipeError

KINDS = ("code", "math", "chat")
SPLITS = ("train", "calib", "eval")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def _seed_of(text: str) -> int:
    return int(hashlib.sha1(text.encode()).hexdigest(), 16) % (2 ** 31)


# ----------------------------------------------------------------------------------------------
# generate


def build_requests(prompts: list[dict], sampled_per_prompt: int, t_lo: float, t_hi: float) -> list[dict]:
    """One greedy answer per train/calib prompt plus `sampled_per_prompt` sampled ones at a
    temperature drawn uniformly in [t_lo, t_hi] (seeded by the prompt id)."""
    reqs = []
    for p in prompts:
        if p["split"] == "eval":
            continue
        reqs.append({"pid": p["id"], "temperature": 0.0, "seed": 0})
        for j in range(sampled_per_prompt):
            s = _seed_of(f"{p['id']}#{j}")
            t = t_lo + (t_hi - t_lo) * ((s % 1000) / 999.0)
            reqs.append({"pid": p["id"], "temperature": round(t, 3), "seed": s})
    return reqs


def generate(target: str, data_dir: str, prompts: list[dict], *, max_new: int, max_prompt: int,
             sampled_per_prompt: int, t_lo: float, t_hi: float, n_seq_max: int, threads: int,
             shard_size: int, max_minutes: float | None = None) -> dict:
    """Answers through the chat template with our engine, n_seq_max sequences per verify batch.
    Resumable: finished shards are kept, the first missing one starts over. With max_minutes,
    generation stops after the shard that reaches that much generation time (over all sessions):
    the prompts are shuffled, so the shards done are a balanced prefix."""
    import dspark_ggml as dg

    gdir = os.path.join(data_dir, "gen")
    os.makedirs(gdir, exist_ok=True)
    done_path = os.path.join(gdir, "done.json")
    if os.path.exists(done_path):
        return read_json(done_path)
    n_ctx = n_seq_max * (max_prompt + max_new + 16)
    llm = dg.LLM(target, n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=threads, n_batch=512)
    try:
        by_id = {p["id"]: p for p in prompts}
        tokens_of = {}
        skipped = 0
        for p in prompts:
            if p["split"] == "eval":
                continue
            toks = llm.apply_chat_template([{"role": "user", "content": p["text"]}])
            if len(toks) > max_prompt:
                skipped += 1
                continue
            tokens_of[p["id"]] = toks
        reqs = [r for r in build_requests([by_id[i] for i in tokens_of], sampled_per_prompt, t_lo, t_hi)]
        n_shards = (len(reqs) + shard_size - 1) // shard_size
        log(f"generate: {len(reqs)} requests from {len(tokens_of)} prompts ({skipped} over "
            f"{max_prompt} prompt tokens skipped), {n_shards} shards of {shard_size}")
        t_gen = c_gen = 0.0
        n_gen = 0
        spent_path = os.path.join(gdir, "spent.json")
        spent = read_json(spent_path)["seconds"] if os.path.exists(spent_path) else 0.0
        stopped = False
        for s in range(n_shards):
            path = os.path.join(gdir, f"shard_{s:05d}.jsonl")
            if os.path.exists(path):
                continue
            if max_minutes is not None and spent >= max_minutes * 60:
                stopped = True
                log(f"generate: --gen-minutes {max_minutes} reached after {s} of {n_shards} shards")
                break
            chunk = reqs[s * shard_size:(s + 1) * shard_size]
            params = [dg.SamplingParams(temperature=r["temperature"], seed=r["seed"], max_tokens=max_new)
                      for r in chunk]
            t0, c0 = time.time(), time.process_time()
            results = llm.generate_batch([tokens_of[r["pid"]] for r in chunk], params)
            dt, dc = time.time() - t0, time.process_time() - c0
            n = sum(len(res.tokens) for res in results)
            t_gen += dt
            c_gen += dc
            n_gen += n
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                for r, res in zip(chunk, results):
                    f.write(json.dumps({**r, "prompt_tokens": tokens_of[r["pid"]], "answer_tokens": list(res.tokens),
                                        "finish": res.finish_reason}) + "\n")
            os.replace(tmp, path)
            spent += dt
            write_json(spent_path, {"seconds": round(spent, 1)})
            log(f"generate: shard {s + 1}/{n_shards}: {n} tokens in {dt:.1f}s ({n / dt:.1f} tok/s; "
                f"{n / max(dc, 1e-9):.1f} tok per CPU-second)")
    finally:
        llm.close()
    done_shards = sum(1 for n in os.listdir(gdir) if n.startswith("shard_") and n.endswith(".jsonl"))
    info = {"requests": len(reqs), "prompts": len(tokens_of), "skipped_long_prompts": skipped,
            "shards": n_shards, "shards_done": done_shards, "stopped_by_time": stopped,
            "generation_seconds_all_sessions": round(spent, 1), "tokens_this_session": n_gen, "seconds_this_session": round(t_gen, 1),
            "tokens_per_s": round(n_gen / t_gen, 1) if t_gen else None,
            "cpu_seconds_this_session": round(c_gen, 1),
            "tokens_per_cpu_s": round(n_gen / c_gen, 1) if c_gen else None}
    write_json(done_path, info)
    return info


def load_generations(data_dir: str) -> list[dict]:
    gdir = os.path.join(data_dir, "gen")
    out = []
    if not os.path.isdir(gdir):
        return out
    for name in sorted(os.listdir(gdir)):
        if name.startswith("shard_") and name.endswith(".jsonl"):
            with open(os.path.join(gdir, name)) as f:
                out.extend(json.loads(line) for line in f if line.strip())
    return out


# ----------------------------------------------------------------------------------------------
# capture


def build_index(data_dir: str, prompts: list[dict]) -> dict:
    """Flat token stream of every generated sequence with at least 2 answer tokens."""
    split = {p["id"]: p["split"] for p in prompts}
    kind = {p["id"]: p["kind"] for p in prompts}
    gens = load_generations(data_dir)
    toks, masks, offs, lens, spl, knd, temps = [], [], [], [], [], [], []
    off = 0
    for g in gens:
        a = g["answer_tokens"]
        if len(a) < 2 or g["pid"] not in split:
            continue
        t = g["prompt_tokens"] + a
        toks.append(np.asarray(t, dtype=np.int32))
        masks.append(np.concatenate([np.zeros(len(g["prompt_tokens"]), np.uint8), np.ones(len(a), np.uint8)]))
        offs.append(off)
        lens.append(len(t))
        spl.append(SPLITS.index(split[g["pid"]]))
        knd.append(KINDS.index(kind[g["pid"]]))
        temps.append(g["temperature"])
        off += len(t)
    if not toks:
        raise RecipeError(f"{data_dir}: nothing usable: no generated answer with 2 or more tokens")
    idx = {"tokens": np.concatenate(toks), "loss_mask": np.concatenate(masks),
           "offsets": np.asarray(offs, np.int64), "lengths": np.asarray(lens, np.int64),
           "split": np.asarray(spl, np.int8), "kind": np.asarray(knd, np.int8),
           "temperature": np.asarray(temps, np.float32)}
    np.savez(os.path.join(data_dir, "index.npz"), **idx)
    return idx


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def capture(target: str, data_dir: str, prompts: list[dict], *, capture_ids: list[int], n_layer: int,
            n_embd: int, head: np.ndarray, final_norm: np.ndarray, rms_eps: float, threads: int,
            n_batch: int, n_seq_max: int) -> dict:
    """Decode every sequence with our runtime, capturing the residual stream entering
    capture_ids and the input of the final norm (id n_layer); store them as fp16 memmaps, and the
    log-sum-exp of the target logits at answer positions (recomputed from the final norm input
    with the GGUF's final norm and head). Resumable at the sequence where it stopped."""
    import dspark_ggml as dg

    prog_path = os.path.join(data_dir, "capture.json")
    prog = read_json(prog_path) if os.path.exists(prog_path) else None
    if prog and prog.get("finished"):
        return prog
    idx_path = os.path.join(data_dir, "index.npz")
    if prog is None or not os.path.exists(idx_path):
        idx = build_index(data_dir, prompts)
        prog = {"done_seqs": 0, "capture_ids": list(capture_ids), "n_embd": n_embd,
                "n_tokens": int(len(idx["tokens"])), "n_seqs": int(len(idx["offsets"])),
                "seconds": 0.0, "finished": False}
        mode = "w+"
    else:
        idx = dict(np.load(idx_path))
        if prog["capture_ids"] != list(capture_ids):
            raise RecipeError(f"{data_dir}: captured ids {prog['capture_ids']} differ from this run's "
                              f"{list(capture_ids)}; use a new --out or the same --features")
        mode = "r+"
    T, nf = prog["n_tokens"], len(capture_ids)
    feats = np.memmap(os.path.join(data_dir, "feats.f16"), np.float16, mode, shape=(T, nf * n_embd))
    final = np.memmap(os.path.join(data_dir, "final.f16"), np.float16, mode, shape=(T, n_embd))
    lse = np.memmap(os.path.join(data_dir, "lse.f32"), np.float32, mode, shape=(T,))
    offs, lens = idx["offsets"], idx["lengths"]
    n_batch = max(n_batch, int(lens.max()))
    model = dg.Model(target)
    ctx = dg.Context(model, n_ctx=n_batch + 64, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=threads)
    ctx.set_capture_layers(list(capture_ids) + [n_layer])
    head_t = torch.from_numpy(head)
    norm_t = torch.from_numpy(final_norm)
    i = prog["done_seqs"]
    t_start, c_start = time.time(), time.process_time()
    prog.setdefault("cpu_seconds", 0.0)
    n_tok = 0
    checked = prog.get("logit_check")
    last_log = time.time()
    while i < len(offs):
        j = i
        total = 0
        while j < len(offs) and j - i < n_seq_max and total + lens[j] <= n_batch:
            total += lens[j]
            j += 1
        toks = np.concatenate([idx["tokens"][offs[s]:offs[s] + lens[s]] for s in range(i, j)])
        pos = np.concatenate([np.arange(lens[s]) for s in range(i, j)])
        sid = np.concatenate([np.full(lens[s], s - i) for s in range(i, j)])
        outputs = None
        if checked is None:  # once: the runtime's logits vs torch's recomputation from the capture
            outputs = np.zeros(len(toks), np.int8)
            ends = np.cumsum([lens[s] for s in range(i, j)]) - 1
            outputs[ends] = 1
        ctx.decode(toks, positions=pos, seq_ids=sid, outputs=outputs)
        cap = ctx.get_captured()
        a, b = offs[i], offs[i] + len(toks)
        feats[a:b] = cap[:, :nf * n_embd]
        fin16 = cap[:, nf * n_embd:].astype(np.float16)
        final[a:b] = fin16
        m = idx["loss_mask"][a:b].astype(bool)
        out = np.zeros(len(toks), np.float32)
        if m.any():
            with torch.no_grad():
                h = _rms(torch.from_numpy(fin16[m].astype(np.float32)), norm_t, rms_eps)
                out[m] = torch.logsumexp(h @ head_t.t(), dim=-1).numpy()
        lse[a:b] = out
        if checked is None:
            rl = ctx.get_logits(copy=True)
            with torch.no_grad():
                h = _rms(torch.from_numpy(fin16[ends].astype(np.float32)), norm_t, rms_eps)
                tl = (h @ head_t.t()).numpy()
            agree = float((rl.argmax(-1) == tl.argmax(-1)).mean())
            checked = {"argmax_agreement": agree, "max_abs_logit_err": float(np.abs(rl - tl).max())}
            log(f"capture: runtime logits vs torch teacher: argmax agreement {agree:.3f}, "
                f"max |err| {checked['max_abs_logit_err']:.3f}")
            if agree < 0.9:
                raise RecipeError("the teacher recomputed from the captured final-norm input does not match "
                                  f"the runtime's logits (argmax agreement {agree:.2f}): capture is broken")
            prog["logit_check"] = checked
        ctx.kv_clear()
        n_tok += len(toks)
        i = j
        if time.time() - last_log > 60 or i == len(offs):
            feats.flush(), final.flush(), lse.flush()
            prog["done_seqs"] = int(i)
            prog["seconds"] = round(prog["seconds"] + time.time() - t_start, 1)
            prog["cpu_seconds"] = round(prog["cpu_seconds"] + time.process_time() - c_start, 1)
            t_start, c_start = time.time(), time.process_time()
            write_json(prog_path, prog)
            last_log = time.time()
            log(f"capture: {i}/{len(offs)} sequences, {n_tok} tokens this session "
                f"({n_tok / max(prog['seconds'], 1e-9):.0f} tok/s, {n_tok / max(prog['cpu_seconds'], 1e-9):.0f} "
                "tok per CPU-second)")
    ctx.close()
    model.close()
    feats.flush(), final.flush(), lse.flush()
    prog.update(done_seqs=int(len(offs)), finished=True,
                tokens_per_s=round(T / max(prog["seconds"], 1e-9), 1),
                tokens_per_cpu_s=round(T / max(prog["cpu_seconds"], 1e-9), 1))
    write_json(prog_path, prog)
    return prog


# ----------------------------------------------------------------------------------------------
# the training view


@dataclass
class DataSet:
    tokens: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    split: np.ndarray
    kind: np.ndarray
    feats: np.ndarray
    final: np.ndarray
    lse: np.ndarray
    capture_ids: list

    def seqs(self, split: str) -> np.ndarray:
        ok = (self.split == SPLITS.index(split))
        # a usable sequence has an anchor: two consecutive answer tokens
        return np.nonzero(ok)[0]

    def batch(self, ids: np.ndarray):
        """Padded [N, S] tokens / loss mask / features / final hidden / lse (float32 torch)."""
        S = int(self.lengths[ids].max())
        N = len(ids)
        E = self.final.shape[1]
        tok = np.zeros((N, S), np.int64)
        lm = np.zeros((N, S), np.uint8)
        fe = np.zeros((N, S, self.feats.shape[1]), np.float32)
        fi = np.zeros((N, S, E), np.float32)
        ls = np.zeros((N, S), np.float32)
        for r, s in enumerate(ids):
            a, n = int(self.offsets[s]), int(self.lengths[s])
            tok[r, :n] = self.tokens[a:a + n]
            lm[r, :n] = self.loss_mask[a:a + n]
            fe[r, :n] = self.feats[a:a + n]
            fi[r, :n] = self.final[a:a + n]
            ls[r, :n] = self.lse[a:a + n]
        return tok, lm, torch.from_numpy(fe), torch.from_numpy(fi), torch.from_numpy(ls)


def open_dataset(data_dir: str, n_embd: int) -> DataSet:
    """The captured data, or a clear refusal when the folder holds nothing usable."""
    need = ["index.npz", "capture.json", "feats.f16", "final.f16", "lse.f32"]
    missing = [n for n in need if not os.path.exists(os.path.join(data_dir, n))]
    if missing:
        raise RecipeError(f"data folder {data_dir}: nothing usable (missing {', '.join(missing)}; "
                          "run the generate and capture stages first)")
    prog = read_json(os.path.join(data_dir, "capture.json"))
    if not prog.get("finished"):
        raise RecipeError(f"data folder {data_dir}: the capture did not finish "
                          f"({prog.get('done_seqs')}/{prog.get('n_seqs')} sequences); rerun with --resume")
    if prog["n_embd"] != n_embd:
        raise RecipeError(f"data folder {data_dir}: captured width {prog['n_embd']} is not the target's {n_embd}")
    idx = dict(np.load(os.path.join(data_dir, "index.npz")))
    T = int(len(idx["tokens"]))
    nf = len(prog["capture_ids"])
    sizes = {"feats.f16": T * nf * n_embd * 2, "final.f16": T * n_embd * 2, "lse.f32": T * 4}
    for name, size in sizes.items():
        if os.path.getsize(os.path.join(data_dir, name)) != size:
            raise RecipeError(f"data folder {data_dir}: {name} has {os.path.getsize(os.path.join(data_dir, name))} "
                              f"bytes, expected {size} for {T} tokens")
    ds = DataSet(idx["tokens"], idx["loss_mask"], idx["offsets"], idx["lengths"], idx["split"], idx["kind"],
                 np.memmap(os.path.join(data_dir, "feats.f16"), np.float16, "r", shape=(T, nf * n_embd)),
                 np.memmap(os.path.join(data_dir, "final.f16"), np.float16, "r", shape=(T, n_embd)),
                 np.memmap(os.path.join(data_dir, "lse.f32"), np.float32, "r", shape=(T,)),
                 list(prog["capture_ids"]))
    lm = ds.loss_mask.astype(bool)
    usable = [s for s in ds.seqs("train")
              if (lm[ds.offsets[s]:ds.offsets[s] + ds.lengths[s] - 1]
                  & lm[ds.offsets[s] + 1:ds.offsets[s] + ds.lengths[s]]).any()]
    if not usable:
        raise RecipeError(f"data folder {data_dir}: nothing usable: no training sequence has two "
                          "consecutive answer tokens")
    return ds
