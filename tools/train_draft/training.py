"""Draft vocabulary, initialisation, the DSpark training loop (checkpointed) and the confidence
calibration (sequential temperature scaling).

Loss (DSpark paper eq. 9-12, as tools/demo_pair/train_draft.py), per slot k with weight
w_k = exp(-k/4) x (every label up to k is an answer token):

    L = sum_k w_k (0.1 CE + 0.9 TV(p_draft, p_target) + 1.0 BCE(conf_k, 1 - TV)) / sum_k w_k

over the reduced vocabulary: p_draft is a softmax over the Vd draft tokens; p_target is the
target's distribution as the capture kept it: its K most likely tokens with their probabilities
over the full vocabulary (the runtime's logits), zero elsewhere. So TV = 1/2 (sum over Vd
|p_draft - p_target| + target mass not on a kept draft token); the mass past the top K counts as
missed, which bounds the true TV from above by at most that tail (data.py reports its size).
CE counts only labels inside Vd. The BCE target is detached.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from data import DataSet, log
from draft_model import DraftConfig, DSparkDraft, attn_mask, count_params
from gguf_target import RecipeError

W_CE, W_TV, W_CONF, DECAY = 0.1, 0.9, 1.0, 4.0


# ----------------------------------------------------------------------------------------------
# vocabulary


def choose_vocab(ds: DataSet, vocab_size: int, coverage: float, fixed: int | None, max_vd: int,
                 always: list[int]) -> tuple[np.ndarray, float, int]:
    """Sorted target ids of the draft vocabulary: `always` (end-of-turn tokens) plus the most
    frequent answer tokens of the training split (ties: smaller id), as few as cover `coverage` of
    them, the count rounded up to a multiple of 64 but at most `max_vd` (the largest vocabulary
    whose GGUF fits the size limit) -- or exactly `fixed` tokens. Returns the ids, their coverage
    and the count `coverage` alone asked for.

    The size must be a multiple of 8: our runtime aborts the process when it creates the context
    of a draft whose d2t length is not (ggml-alloc.c:83: not enough space in the buffer)."""
    lm = ds.loss_mask.astype(bool)
    train_tok = np.zeros(len(ds.tokens), bool)
    for s in ds.seqs("train"):
        train_tok[ds.offsets[s]:ds.offsets[s] + ds.lengths[s]] = True
    counts = np.bincount(ds.tokens[lm & train_tok].astype(np.int64), minlength=vocab_size)
    total = counts.sum()
    if total == 0:
        raise RecipeError("no answer tokens in the training split")
    always = [int(t) for t in dict.fromkeys(always) if t is not None and 0 <= t < vocab_size]
    rest = [int(t) for t in np.lexsort((np.arange(vocab_size), -counts)) if int(t) not in set(always)]
    order = np.array(always + rest)  # the always-tokens first, then by frequency
    if fixed is not None:
        if not 32 <= fixed <= vocab_size or fixed % 8:
            raise RecipeError(f"--draft-vocab {fixed} does not fit: it must be a multiple of 8 in 32 .. "
                              f"{vocab_size} (the target vocabulary; the runtime needs the multiple of 8)")
        n = fixed
    else:
        cum = np.cumsum(counts[order]) / total
        wanted = int(np.searchsorted(cum, coverage) + 1)
        wanted = min(vocab_size - vocab_size % 8, int(math.ceil(wanted / 64) * 64))
        n = min(wanted, max_vd - max_vd % 8)
    ids = np.sort(order[:n]).astype(np.int64)
    return ids, float(counts[ids].sum() / total), (n if fixed is not None else wanted)


# ----------------------------------------------------------------------------------------------
# init


def init_draft(cfg: DraftConfig, reader, info, vocab_ids: np.ndarray, emb: np.ndarray, head: np.ndarray,
               final_norm: np.ndarray, init: str, seed: int) -> DSparkDraft:
    """Layers: copies of the target's last (--init last) or first (--init first) layers, or random;
    fc picks the captured feature nearest the first copied layer's input (identity block), so that
    layer starts reading about what it read in the target; hidden_norm = its input norm; norm =
    the target's final norm."""
    import gguf_target as gt

    torch.manual_seed(seed)
    d = DSparkDraft(cfg)
    d.set_vocab(torch.from_numpy(vocab_ids), torch.from_numpy(emb), torch.from_numpy(head))
    if init in ("last", "first"):
        first = info.n_layer - cfg.num_hidden_layers if init == "last" else 0
        for i, layer in enumerate(d.layers):
            w = gt.layer_weights(reader, info, first + i)
            layer.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()}, strict=True)
        E = cfg.hidden_size
        # fc starts as the identity on the captured feature nearest the first copied layer's input
        j = int(np.argmin([abs(c - first) for c in cfg.capture_ids]))
        with torch.no_grad():
            fc = torch.zeros_like(d.fc.weight)
            fc[:, j * E:(j + 1) * E] = torch.eye(E)
            d.fc.weight.copy_(fc)
            d.hidden_norm.weight.copy_(d.layers[0].input_layernorm.weight)
            d.norm.weight.copy_(torch.from_numpy(final_norm))
    return d


# ----------------------------------------------------------------------------------------------
# batches and loss


def sample_anchors(mask: np.ndarray, n: int, gen: torch.Generator) -> np.ndarray:
    ok = np.nonzero(mask[:-1].astype(bool) & mask[1:].astype(bool))[0]
    if len(ok) <= n:
        return ok
    return np.sort(ok[torch.randperm(len(ok), generator=gen)[:n].numpy()])


def build_blocks(tokens, loss_mask, lengths, anchors_list, B: int, mask_id: int):
    N = tokens.shape[0]
    A = max(1, max(len(a) for a in anchors_list))
    k = np.arange(B)
    ids = np.full((N, A, B), mask_id, np.int64)
    pos = np.zeros((N, A, B), np.int64)
    prev = np.zeros((N, A, B), np.int64)
    lab = np.zeros((N, A, B), np.int64)
    val = np.zeros((N, A, B), np.float32)
    anc = np.full((N, A, B), -1, np.int64)
    for i, anchors in enumerate(anchors_list):
        S = int(lengths[i])
        for a, p in enumerate(anchors):
            ids[i, a, 0] = tokens[i, p]
            pos[i, a] = p + k
            tgt = np.minimum(p + 1 + k, S - 1)
            lab[i, a] = tokens[i, tgt]
            prev[i, a] = tokens[i, np.minimum(p + k, S - 1)]
            ok = (p + 1 + k < S) & (loss_mask[i, tgt] > 0)
            val[i, a] = np.cumprod(ok)
            anc[i, a] = p
    r = lambda x: torch.from_numpy(x.reshape(N, A * B))
    return r(ids), r(pos), r(prev), r(lab), r(val), r(anc), A


def teacher_probs(t2d: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor, Vd: int) -> torch.Tensor:
    """Dense target probabilities over the draft vocabulary [..., Vd] from the kept top-K target
    ids [..., K] and log-probabilities; ids outside the draft vocabulary add nothing."""
    d = t2d[ids]
    p = logp.exp() * (d >= 0)
    return torch.zeros(*ids.shape[:-1], Vd).scatter_add_(-1, d.clamp(min=0), p)


def bf16_is_fast() -> bool:
    """Whether this CPU has bf16 dot products (AVX-512 BF16 or AMX), which torch's oneDNN uses."""
    from dspark_ggml.system import cpu_flags

    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def dspark_loss(draft: DSparkDraft, t2d: torch.Tensor, feats, teacher_ids, teacher_logp, blocks, B: int,
                bf16_body: bool = False):
    """The loss above. With bf16_body the fusion and the decoder layers run in bf16 (autocast); the
    heads and the loss stay f32: in bf16 they learned much less per step (20 steps on Zen 4)."""
    ids, pos, prev, lab, val, anc, _ = blocks
    N, S, _ = feats.shape
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_body):
        ctx_kv = draft.context_kv(feats, torch.arange(S)[None].expand(N, S))
        h = draft.backbone(ids, pos, ctx_kv, attn_mask(anc, S, B))
    logits, conf = draft.heads(h.float(), prev)
    tpos = pos.clamp(max=S - 1)[..., None].expand(-1, -1, teacher_ids.shape[-1])
    with torch.no_grad():
        pt = teacher_probs(t2d, torch.gather(teacher_ids, 1, tpos), torch.gather(teacher_logp, 1, tpos),
                           logits.shape[-1])
        out_mass = (1.0 - pt.sum(-1)).clamp(min=0.0)
    logp = torch.log_softmax(logits, dim=-1)
    pd = logp.exp()
    dl = t2d[lab]
    in_vocab = (dl >= 0).float()
    ce = -torch.gather(logp, -1, dl.clamp(min=0)[..., None])[..., 0] * in_vocab
    tv = 0.5 * ((pd - pt).abs().sum(-1) + out_mass)
    bce = F.binary_cross_entropy_with_logits(conf, (1.0 - tv).detach().clamp(0, 1), reduction="none")
    k = torch.arange(ids.shape[1]) % B
    w = torch.exp(-k.float() / DECAY)[None] * val
    wsum = w.sum().clamp(min=1e-6)
    loss = ((W_CE * ce + W_TV * tv + W_CONF * bce) * w).sum() / wsum
    with torch.no_grad():
        acc = (draft.vocab_ids[logits.argmax(-1)] == lab).float()
        vk = val.view(N, -1, B).sum((0, 1))
        stats = {"loss": loss.item(), "ce": float((ce * w).sum() / wsum), "tv": float((tv * w).sum() / wsum),
                 "bce": float((bce * w).sum() / wsum),
                 "acc_k": ((acc * val).view(N, -1, B).sum((0, 1)) / vk.clamp(min=1)).tolist()}
    return loss, stats


def cosine_lr(step: int, done: float, warmup: int, peak: float, floor: float = 0.1) -> float:
    """Linear warm-up over the first steps, then a cosine to floor x peak over the share of the
    training done (0..1)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def make_t2d(vocab_ids: torch.Tensor, V: int) -> torch.Tensor:
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[vocab_ids] = torch.arange(len(vocab_ids))
    return t2d


# ----------------------------------------------------------------------------------------------
# training loop


def trainable_state(d: DSparkDraft) -> dict:
    return {k: v.detach().clone() for k, v in d.state_dict().items() if k not in ("embed_tokens.weight",)}


def train(draft: DSparkDraft, ds: DataSet, *, train_dir: str, steps: int,
          batch: int, anchors: int, lr: float, warmup: int, wd: float, seed: int, ckpt_every: int,
          resume: bool, max_minutes: float | None = None, log_every: int = 10,
          bf16_body: bool = False) -> dict:
    """AdamW (0.9, 0.95), cosine schedule to 10 %, clip 1.0. Checkpoint (model, optimizer, RNG,
    history) every ckpt_every steps to train_dir/ckpt.pt; resume=True continues from it.

    The share of the training done is step / steps, or with max_minutes the training time spent
    over all sessions / max_minutes when that is larger: the run stops at 1 and the cosine runs on
    that share, so the whole time budget is used at whatever speed the machine gives, and a slow
    start (or a loaded machine) does not fix the number of steps."""
    os.makedirs(train_dir, exist_ok=True)
    cfg = draft.c
    B = cfg.block_size
    t2d = make_t2d(draft.vocab_ids, cfg.vocab_size)
    decay = [p for n, p in draft.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in draft.named_parameters() if p.requires_grad and p.ndim < 2]
    params = decay + no_decay
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    seqs = ds.seqs("train")
    lm_all = ds.loss_mask.astype(bool)
    seqs = np.array([s for s in seqs if (lm_all[ds.offsets[s]:ds.offsets[s] + ds.lengths[s] - 1]
                                         & lm_all[ds.offsets[s] + 1:ds.offsets[s] + ds.lengths[s]]).any()])
    step, hist, ema, perm, pi, wall, cpu = 0, [], None, None, 0, 0.0, 0.0
    ckpt = os.path.join(train_dir, "ckpt.pt")
    if resume and os.path.exists(ckpt):
        st = torch.load(ckpt, weights_only=False)
        draft.load_state_dict({**draft.state_dict(), **st["model"]}, strict=True)
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        step, hist, ema, perm, pi, wall = st["step"], st["hist"], st["ema"], st["perm"], st["pi"], st["wall"]
        cpu = st.get("cpu", 0.0)
        log(f"train: resumed at step {step}/{steps}")

    def save():
        tmp = ckpt + ".tmp"
        torch.save({"model": trainable_state(draft), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "hist": hist, "ema": ema, "perm": perm, "pi": pi, "wall": wall, "cpu": cpu,
                    "config": cfg.to_dict()}, tmp)
        os.replace(tmp, ckpt)

    log(f"train: {len(seqs)} sequences, draft {count_params(draft)} params "
        f"({count_params(draft, True)} trainable), {steps} steps x {batch} seqs x {anchors} anchors, "
        f"layers in {'bf16' if bf16_body else 'f32'}")
    draft.train()
    t0, c0 = time.time(), time.process_time()

    def done() -> float:
        by_steps = step / steps
        if max_minutes is None:
            return by_steps
        return max(by_steps, (wall + time.time() - t0) / (max_minutes * 60))

    finished = done() >= 1.0
    while not finished:
        if perm is None or pi + batch > len(perm):
            perm = torch.randperm(len(seqs), generator=gen).numpy()
            pi = 0
        ids = np.sort(seqs[perm[pi:pi + batch]])
        pi += batch
        tok, lm, fe, ti, tl = ds.batch(ids)
        lens = ds.lengths[ids]
        anc = [sample_anchors(lm[i, :lens[i]], anchors, gen) for i in range(len(ids))]
        blocks = build_blocks(tok, lm, lens, anc, B, cfg.mask_token_id)
        cur = cosine_lr(step, done(), warmup, lr)
        for g in opt.param_groups:
            g["lr"] = cur
        loss, st = dspark_loss(draft, t2d, fe, ti, tl, blocks, B, bf16_body)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = st if ema is None else {k: ([0.9 * a + 0.1 * b for a, b in zip(ema[k], st[k])] if k == "acc_k"
                                          else 0.9 * ema[k] + 0.1 * st[k]) for k in st}
        step += 1
        finished = done() >= 1.0
        if step % log_every == 0 or finished:
            now, cnow = time.time(), time.process_time()
            wall += now - t0
            cpu += cnow - c0
            t0, c0 = now, cnow
            hist.append({"step": step, "lr": cur, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                         **{k: (round(v, 4) if k != "acc_k" else [round(a, 3) for a in v]) for k, v in ema.items()}})
            log(f"train step {step}/{steps} loss {ema['loss']:.3f} ce {ema['ce']:.3f} tv {ema['tv']:.3f} "
                f"bce {ema['bce']:.3f} | top1 by slot {' '.join(f'{a:.2f}' for a in ema['acc_k'])} "
                f"({wall:.0f}s, {step / max(wall, 1e-9):.2f} steps/s, {cpu / max(step, 1):.2f} CPU-s/step)")
        if step % ckpt_every == 0 or finished:
            wall += time.time() - t0
            cpu += time.process_time() - c0
            t0, c0 = time.time(), time.process_time()
            save()
    return {"steps": step, "steps_requested": steps, "layers_dtype": "bf16" if bf16_body else "f32",
            "wall_s": round(wall, 1),
            "steps_per_s": round(step / max(wall, 1e-9), 3),
            "cpu_s": round(cpu, 1), "cpu_s_per_step": round(cpu / max(step, 1), 3),
            "sequences": int(len(seqs)), "history": hist, "final": hist[-1] if hist else None}


# ----------------------------------------------------------------------------------------------
# calibration: sequential temperature scaling of the confidence head


def ece(p: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    if len(p) == 0:
        return 0.0
    b = np.minimum((p * bins).astype(int), bins - 1)
    tot = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            tot += m.sum() * abs(p[m].mean() - y[m].mean())
    return float(tot / len(p))


@torch.no_grad()
def draft_on_split(draft: DSparkDraft, ds: DataSet, split: str, anchors: int, batch: int, seed: int):
    """Run the draft as the runtime does (argmax chain) at anchors of the split's sequences.
    Returns confidence logits z [M, B], acceptance a [M, B] (draft token == the sequence's
    token, i.e. what the target emitted) and validity v [M, B]."""
    draft.eval()
    cfg = draft.c
    B = cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    seqs = ds.seqs(split)
    Z, Acc, V = [], [], []
    for i in range(0, len(seqs), batch):
        ids = seqs[i:i + batch]
        tok, lm, fe, _, _ = ds.batch(ids)
        lens = ds.lengths[ids]
        anc = [sample_anchors(lm[r, :lens[r]], anchors, gen) for r in range(len(ids))]
        if not any(len(a) for a in anc):
            continue
        bids, pos, prev, lab, val, an, A = build_blocks(tok, lm, lens, anc, B, cfg.mask_token_id)
        N, S = tok.shape
        ctx_kv = draft.context_kv(fe, torch.arange(S)[None].expand(N, S))
        h = draft.backbone(bids, pos, ctx_kv, attn_mask(an, S, B))
        h = h.view(N, A, B, -1)
        x, z = draft.chain(h, bids.view(N, A, B)[:, :, 0])
        lab = lab.view(N, A, B)
        val = val.view(N, A, B)
        real = an.view(N, A, B)[:, :, 0] >= 0
        Z.append(z[real].numpy())
        Acc.append((x == lab)[real].float().numpy())
        V.append(val[real].numpy())
    if not Z:
        raise RecipeError(f"the {split} split has no usable sequence (no two consecutive answer tokens)")
    return np.concatenate(Z), np.concatenate(Acc), np.concatenate(V)


def sequential_temperature_scaling(z: np.ndarray, acc: np.ndarray, val: np.ndarray, bins: int = 15):
    """DSpark's STS: per position k, left to right, the temperature T_k minimising the ECE of the
    running product prod_{j<=k} sigmoid(z_j / T_j) against 'every draft token up to k accepted',
    with T_1 .. T_{k-1} fixed. Rows count at k while the block is valid through k."""
    M, B = z.shape
    grid = np.exp(np.linspace(np.log(0.05), np.log(20.0), 241))
    temps, before, after = [], [], []
    prefix_acc = np.cumprod(acc, axis=1)
    run_raw = np.ones(M)
    run_cal = np.ones(M)
    sig = lambda x: 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))
    for k in range(B):
        m = val[:, k] > 0
        y = prefix_acc[m, k]
        raw = run_raw[m] * sig(z[m, k])
        before.append(ece(raw, y, bins))
        errs = np.array([ece(run_cal[m] * sig(z[m, k] / t), y, bins) for t in grid])
        # the smallest ECE; among near-ties the temperature closest to 1 (no change)
        near = np.nonzero(errs <= errs.min() + 1e-4)[0]
        i = near[np.argmin(np.abs(np.log(grid[near])))]
        best, best_t = float(errs[i]), float(grid[i])
        temps.append(best_t)
        after.append(best)
        run_raw = run_raw * sig(z[:, k])
        run_cal = run_cal * sig(z[:, k] / best_t)
    mean_acc = [float(prefix_acc[val[:, k] > 0, k].mean()) if (val[:, k] > 0).any() else 0.0 for k in range(B)]
    cond = [float(acc[(val[:, k] > 0) & (prefix_acc[:, k - 1] > 0 if k else True), k].mean())
            if ((val[:, k] > 0) & (prefix_acc[:, k - 1] > 0 if k else True)).any() else 0.0 for k in range(B)]
    full = val.all(axis=1)
    tau = float(1.0 + prefix_acc[full].sum(axis=1).mean()) if full.any() else None
    return {"temperatures": [round(t, 4) for t in temps], "ece_raw": [round(e, 4) for e in before],
            "ece_calibrated": [round(e, 4) for e in after], "prefix_acceptance": [round(a, 4) for a in mean_acc],
            "conditional_acceptance": [round(a, 4) for a in cond], "tau_greedy_torch": tau,
            "rows": int(M), "rows_full_block": int(full.sum())}
