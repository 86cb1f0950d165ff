"""Data stages: the target answers its prompts (generate), then our runtime captures the draft's
features over prompt + answer (capture). Torch never runs the target.

Layout of a data folder (DATA = OUT/data unless --data names another):

    prompts.jsonl          every prompt with its id, kind and split (train / calib / eval)
    gen/shard_NNNNN.jsonl  answers, one request per line (prompt tokens, answer tokens, T, seed)
    gen/done.json          generation finished (counts, tokens/s)
    index.npz              the sequences captured: flat tokens, loss mask (1 = answer token),
                           offsets, lengths, split and kind per sequence
    feats.f16              memmap [T, n_feat * E] fp16: residual streams entering the capture ids
    teacher_ids.i32        memmap [T, K] int32: the K most likely next tokens of the target
    teacher_logp.f32       memmap [T, K] f32: their log-probabilities under the target (the runtime's
                           own logits, full vocabulary); both zero where no answer token follows
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


TEACHER_TOP_K = 64  # next-token log-probabilities kept per answer position
TEACHER_ROWS = 64   # logit rows reduced at once (a few MB: stays in cache)


def teacher_positions(loss_mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """1 where the next token of the same sequence is an answer token (the positions whose
    target distribution the draft learns), else 0; loss_mask and lengths of consecutive sequences."""
    nxt = np.zeros(len(loss_mask), np.int8)
    nxt[:-1] = loss_mask[1:]
    nxt[np.cumsum(lengths) - 1] = 0  # a sequence's last token has no next token
    return nxt


def top_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest entries of each row as (ids, log-softmax over the whole row)."""
    ids = np.zeros((len(logits), k), np.int32)
    logp = np.zeros((len(logits), k), np.float32)
    buf = np.empty((min(TEACHER_ROWS, len(logits)), logits.shape[1]), np.float32)  # reused: no page faults
    for r0 in range(0, len(logits), TEACHER_ROWS):
        n = min(TEACHER_ROWS, len(logits) - r0)
        np.copyto(buf[:n], logits[r0:r0 + n])
        x = torch.from_numpy(buf[:n])
        top, ix = torch.topk(x, k, dim=-1)
        peak = top[:, :1]
        lse = peak + x.sub_(peak).exp_().sum(-1, keepdim=True).log_()
        ids[r0:r0 + n] = ix.numpy()
        logp[r0:r0 + n] = (top - lse).numpy()
    return ids, logp


def capture(target: str, data_dir: str, prompts: list[dict], *, capture_ids: list[int], n_embd: int,
            threads: int, n_batch: int, n_seq_max: int, top_k: int = TEACHER_TOP_K) -> dict:
    """Prefill every sequence with our runtime, many sequences per batch: keep the residual
    stream entering capture_ids (fp16 memmap) and, where an answer token follows, the target's
    top_k next-token log-probabilities from the runtime's own logits (the teacher). Resumable at
    the sequence where it stopped."""
    import dspark_ggml as dg

    prog_path = os.path.join(data_dir, "capture.json")
    prog = read_json(prog_path) if os.path.exists(prog_path) else None
    if prog and prog.get("finished"):
        return prog
    idx_path = os.path.join(data_dir, "index.npz")
    if prog is None or not os.path.exists(idx_path):
        idx = build_index(data_dir, prompts)
        prog = {"done_seqs": 0, "capture_ids": list(capture_ids), "n_embd": n_embd, "teacher_top_k": top_k,
                "n_tokens": int(len(idx["tokens"])), "n_seqs": int(len(idx["offsets"])),
                "seconds": 0.0, "finished": False}
        mode = "w+"
    else:
        idx = dict(np.load(idx_path))
        if prog["capture_ids"] != list(capture_ids):
            raise RecipeError(f"{data_dir}: captured ids {prog['capture_ids']} differ from this run's "
                              f"{list(capture_ids)}; use a new --out or the same --features")
        if prog.get("teacher_top_k") != top_k:
            raise RecipeError(f"{data_dir}: an earlier capture kept teacher top-{prog.get('teacher_top_k')}, "
                              f"this one keeps top-{top_k}; use a new --out")
        mode = "r+"
    T, nf = prog["n_tokens"], len(capture_ids)
    feats = np.memmap(os.path.join(data_dir, "feats.f16"), np.float16, mode, shape=(T, nf * n_embd))
    t_ids = np.memmap(os.path.join(data_dir, "teacher_ids.i32"), np.int32, mode, shape=(T, top_k))
    t_logp = np.memmap(os.path.join(data_dir, "teacher_logp.f32"), np.float32, mode, shape=(T, top_k))
    offs, lens = idx["offsets"], idx["lengths"]
    wanted = teacher_positions(idx["loss_mask"], lens)
    n_batch = max(n_batch, int(lens.max()))
    model = dg.Model(target)
    ctx = dg.Context(model, n_ctx=n_batch + 64, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=threads)
    ctx.set_capture_layers(list(capture_ids))
    i = prog["done_seqs"]
    t_start, c_start = time.time(), time.process_time()
    prog.setdefault("cpu_seconds", 0.0)
    n_tok = 0
    last_log = time.time()
    while i < len(offs):
        j = i
        total = 0
        while j < len(offs) and j - i < n_seq_max and total + lens[j] <= n_batch:
            total += lens[j]
            j += 1
        a, b = offs[i], offs[j - 1] + lens[j - 1]
        toks = idx["tokens"][a:b]
        pos = np.concatenate([np.arange(lens[s]) for s in range(i, j)])
        sid = np.concatenate([np.full(lens[s], s - i) for s in range(i, j)])
        outputs = wanted[a:b]
        ctx.decode(toks, positions=pos, seq_ids=sid, outputs=outputs)
        feats[a:b] = ctx.get_captured()
        rows = a + np.nonzero(outputs)[0]
        if len(rows):
            t_ids[rows], t_logp[rows] = top_logprobs(ctx.get_logits(), top_k)
        ctx.kv_clear()
        n_tok += len(toks)
        i = j
        if time.time() - last_log > 60 or i == len(offs):
            feats.flush(), t_ids.flush(), t_logp.flush()
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
    feats.flush(), t_ids.flush(), t_logp.flush()
    rows = np.nonzero(wanted)[0]
    tail = 1.0 - np.exp(np.asarray(t_logp[rows], np.float64)).sum(-1) if len(rows) else np.zeros(1)
    prog.update(done_seqs=int(len(offs)), finished=True,
                teacher_tail_mass={"mean": round(float(tail.mean()), 4),
                                   "p90": round(float(np.quantile(tail, 0.9)), 4)},
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
    teacher_ids: np.ndarray
    teacher_logp: np.ndarray
    capture_ids: list

    def seqs(self, split: str) -> np.ndarray:
        ok = (self.split == SPLITS.index(split))
        # a usable sequence has an anchor: two consecutive answer tokens
        return np.nonzero(ok)[0]

    def batch(self, ids: np.ndarray):
        """Padded [N, S] tokens / loss mask (numpy), features [N, S, F], teacher ids [N, S, K]
        (int64) and log-probabilities [N, S, K] (torch)."""
        S = int(self.lengths[ids].max())
        N = len(ids)
        K = self.teacher_ids.shape[1]
        tok = np.zeros((N, S), np.int64)
        lm = np.zeros((N, S), np.uint8)
        fe = np.zeros((N, S, self.feats.shape[1]), np.float32)
        ti = np.zeros((N, S, K), np.int64)
        tl = np.full((N, S, K), -np.inf, np.float32)
        for r, s in enumerate(ids):
            a, n = int(self.offsets[s]), int(self.lengths[s])
            tok[r, :n] = self.tokens[a:a + n]
            lm[r, :n] = self.loss_mask[a:a + n]
            fe[r, :n] = self.feats[a:a + n]
            ti[r, :n] = self.teacher_ids[a:a + n]
            tl[r, :n] = self.teacher_logp[a:a + n]
        return tok, lm, torch.from_numpy(fe), torch.from_numpy(ti), torch.from_numpy(tl)


def open_dataset(data_dir: str, n_embd: int) -> DataSet:
    """The captured data, or a clear refusal when the folder holds nothing usable."""
    need = ["index.npz", "capture.json", "feats.f16", "teacher_ids.i32", "teacher_logp.f32"]
    missing = [n for n in need if not os.path.exists(os.path.join(data_dir, n))]
    if missing and os.path.exists(os.path.join(data_dir, "final.f16")):
        raise RecipeError(f"data folder {data_dir}: captured by an older recipe (final.f16 and lse.f32, no "
                          "teacher top-k); delete its capture.json and feats.f16 and run the capture again")
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
    nf, K = len(prog["capture_ids"]), prog["teacher_top_k"]
    sizes = {"feats.f16": T * nf * n_embd * 2, "teacher_ids.i32": T * K * 4, "teacher_logp.f32": T * K * 4}
    for name, size in sizes.items():
        if os.path.getsize(os.path.join(data_dir, name)) != size:
            raise RecipeError(f"data folder {data_dir}: {name} has {os.path.getsize(os.path.join(data_dir, name))} "
                              f"bytes, expected {size} for {T} tokens")
    ds = DataSet(idx["tokens"], idx["loss_mask"], idx["offsets"], idx["lengths"], idx["split"], idx["kind"],
                 np.memmap(os.path.join(data_dir, "feats.f16"), np.float16, "r", shape=(T, nf * n_embd)),
                 np.memmap(os.path.join(data_dir, "teacher_ids.i32"), np.int32, "r", shape=(T, K)),
                 np.memmap(os.path.join(data_dir, "teacher_logp.f32"), np.float32, "r", shape=(T, K)),
                 list(prog["capture_ids"]))
    lm = ds.loss_mask.astype(bool)
    usable = [s for s in ds.seqs("train")
              if (lm[ds.offsets[s]:ds.offsets[s] + ds.lengths[s] - 1]
                  & lm[ds.offsets[s] + 1:ds.offsets[s] + ds.lengths[s]]).any()]
    if not usable:
        raise RecipeError(f"data folder {data_dir}: nothing usable: no training sequence has two "
                          "consecutive answer tokens")
    return ds
