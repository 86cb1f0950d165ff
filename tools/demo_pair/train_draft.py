"""Train the DSpark draft on the target's own generations (gen_data.py) with the DSpark loss.

Per step: BATCH sequences; in each, ANCHORS anchor positions p drawn uniformly (without
replacement, torch.Generator seeded) among positions with loss_mask[p] = loss_mask[p+1] = 1
(an anchor is a generated token and so is the token after it). Block = [x_p, MASK x (B-1)] at
positions p..p+B-1; slot k (0-based) is labelled x_{p+1+k}; a slot counts while every label up to it
is a supervised (generated) token (cumulative product). Markov prev for slot k is x_{p+k}
(teacher forcing; slot 0 gets the anchor). The context is the target's features at positions < p.

Loss (DSpark paper eq. 9-12, DeepSpec config): per slot k, weight w_k = exp(-k / 4) x valid;
  L = sum_k w_k (0.1 CE(z_k, x_{p+1+k}) + 0.9 TV(softmax z_k, p_t) + 1.0 BCE(c_k, 1 - TV)) / sum_k w_k
where z_k are the Markov-corrected draft logits, p_t = softmax of the target logits at position
p+k (recomputed from the stored final hidden state with the frozen target head), c_k the
confidence logit and the BCE target 1 - TV is detached.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from common import add_optimizer_args, cosine_lr, log, start_step, step_parser, target_tokenizer, write_json
from draft import DraftConfig, DSparkDraft, count_params, deepspec_layer_ids
from targetio import load_target

W_CE, W_TV, W_CONF, DECAY = 0.1, 0.9, 1.0, 4.0


def make_draft_config(tcfg, n_layers: int, block_size: int, mask_id: int, markov_rank: int) -> DraftConfig:
    return DraftConfig(
        vocab_size=tcfg.vocab_size,
        hidden_size=tcfg.hidden_size,
        intermediate_size=tcfg.intermediate_size,
        num_hidden_layers=n_layers,
        num_attention_heads=tcfg.num_attention_heads,
        num_key_value_heads=tcfg.num_key_value_heads,
        head_dim=tcfg.head_dim,
        rms_norm_eps=tcfg.rms_norm_eps,
        rope_theta=float(tcfg.rope_parameters["rope_theta"]),
        target_layer_ids=deepspec_layer_ids(tcfg.num_hidden_layers, n_layers),
        num_target_layers=tcfg.num_hidden_layers,
        block_size=block_size,
        mask_token_id=mask_id,
        markov_rank=markov_rank,
    )


def sample_anchors(mask: np.ndarray, n: int, gen: torch.Generator) -> np.ndarray:
    ok = np.nonzero(mask[:-1].astype(bool) & mask[1:].astype(bool))[0]
    if len(ok) == 0:
        return ok
    if len(ok) <= n:
        return ok
    idx = torch.randperm(len(ok), generator=gen)[:n].numpy()
    return np.sort(ok[idx])


def build_batch(tokens, loss_mask, anchors_list, B: int, mask_id: int):
    """Returns block_ids, block_pos, prev, labels, valid [N, A*B]; anchor_of [N, A*B] (position p);
    teacher positions [N, A*B]. Sequences with fewer anchors are padded with invalid blocks."""
    N, S = tokens.shape
    A = max(len(a) for a in anchors_list)
    k = np.arange(B)
    ids = np.full((N, A, B), mask_id, dtype=np.int64)
    pos = np.zeros((N, A, B), dtype=np.int64)
    prev = np.zeros((N, A, B), dtype=np.int64)
    lab = np.zeros((N, A, B), dtype=np.int64)
    val = np.zeros((N, A, B), dtype=np.float32)
    anc = np.full((N, A, B), -1, dtype=np.int64)  # -1: padding block, sees nothing but itself
    for i, anchors in enumerate(anchors_list):
        for a, p in enumerate(anchors):
            ids[i, a, 0] = tokens[i, p]
            pos[i, a] = p + k
            tgt = np.minimum(p + 1 + k, S - 1)
            lab[i, a] = tokens[i, tgt]
            prev[i, a] = tokens[i, np.minimum(p + k, S - 1)]
            ok = (p + 1 + k < S) & (loss_mask[i, tgt] > 0)
            val[i, a] = np.cumprod(ok).astype(np.float32)
            anc[i, a] = p
    r = lambda x: torch.from_numpy(x.reshape(N, A * B))
    return r(ids), r(pos), r(prev), r(lab), r(val), r(anc), A


def attn_mask(anchor_pos: torch.Tensor, S: int, B: int) -> torch.Tensor:
    """[N, 1, Q, S+Q] bool: block queries see context keys t < anchor and their own block."""
    N, Q = anchor_pos.shape
    t = torch.arange(S)
    ctx = t[None, None, :] < anchor_pos[:, :, None]  # [N, Q, S]
    blk_id = torch.arange(Q) // B
    own = blk_id[:, None] == blk_id[None, :]  # [Q, Q]
    m = torch.cat([ctx, own[None].expand(N, Q, Q)], dim=-1)
    return m[:, None]


def dspark_loss(draft: DSparkDraft, head_w, feats, final_h, block_ids, block_pos, prev, labels, valid,
                anc, B):
    N, S, _ = feats.shape
    ctx = draft.context(feats)
    ctx_kv = draft.context_kv(ctx, torch.arange(S)[None].expand(N, S))
    mask = attn_mask(anc, S, B)
    h = draft.backbone(block_ids, block_pos, ctx_kv, mask)
    logits, conf = draft.heads(h, prev)
    # teacher distribution at position p+k (predicts p+k+1) from the stored final hidden state
    tpos = block_pos.clamp(max=S - 1)
    th = torch.gather(final_h, 1, tpos[..., None].expand(-1, -1, final_h.shape[-1]))
    with torch.no_grad():
        pt = torch.softmax(th @ head_w.t(), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    pd = logp.exp()
    ce = -torch.gather(logp, -1, labels[..., None])[..., 0]
    tv = 0.5 * (pd - pt).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(conf, (1.0 - tv).detach().clamp(0, 1), reduction="none")
    k = torch.arange(block_ids.shape[1]) % B
    w = torch.exp(-k.float() / DECAY)[None] * valid
    wsum = w.sum().clamp(min=1e-6)
    loss = ((W_CE * ce + W_TV * tv + W_CONF * bce) * w).sum() / wsum
    with torch.no_grad():
        acc = (logits.argmax(-1) == labels).float()
        stats = {
            "loss": loss.item(), "ce": (ce * w).sum().item() / wsum.item(),
            "tv": (tv * w).sum().item() / wsum.item(),
            "bce": (bce * w).sum().item() / wsum.item(),
            "acc_k": [((acc * valid).view(N, -1, B).sum((0, 1))
                       / valid.view(N, -1, B).sum((0, 1)).clamp(min=1)).tolist()],
        }
    return loss, stats


def main(argv=None):
    ap = step_parser(seed=777)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--anchors", type=int, default=40)
    add_optimizer_args(ap, wd=0.01)
    ap.add_argument("--init", default="last", choices=["random", "last", "first"],
                    help="draft decoder layers: random init (std 0.02), or copies of the target's last / "
                         "first n decoder layers")
    args, timer, tdir = start_step(ap, argv)
    ddir = os.path.join(args.out, "data")
    target = load_target(tdir)
    tok = target_tokenizer(tdir)
    mask_id = tok.token_to_id("<|mask|>")
    cfg = make_draft_config(target.config, args.layers, args.block_size, mask_id, args.markov_rank)
    d = np.load(os.path.join(ddir, "draft_data.npz"))
    tokens, loss_mask = d["tokens"].astype(np.int64), d["loss_mask"]
    assert list(d["target_layer_ids"]) == cfg.target_layer_ids, \
        (list(d["target_layer_ids"]), cfg.target_layer_ids)
    feats_all = np.load(os.path.join(ddir, "draft_feats.npy"), mmap_mode="r")
    hid_all = np.load(os.path.join(ddir, "draft_final_hidden.npy"), mmap_mode="r")
    N, S = tokens.shape
    log(f"draft data: {N} sequences of {S}; target layer ids {cfg.target_layer_ids}")

    torch.manual_seed(args.seed)
    draft = DSparkDraft(cfg)
    draft.load_target(target)
    if args.init != "random":
        L = target.config.num_hidden_layers
        first = L - args.layers if args.init == "last" else 0
        for i, layer in enumerate(draft.layers):
            layer.load_state_dict(target.model.layers[first + i].state_dict(), strict=True)
    head_w = target.lm_head.weight.detach()
    log(f"draft params: {count_params(draft)} total, {count_params(draft, True)} trainable")

    params = [p for p in draft.parameters() if p.requires_grad]
    decay = [p for n, p in draft.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in draft.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    steps_per_epoch = N // args.batch
    total = int(args.epochs * steps_per_epoch)
    gen = torch.Generator().manual_seed(args.seed)
    hist = []
    ema = None
    draft.train()
    step = 0
    while step < total:
        perm = torch.randperm(N, generator=gen).numpy()
        for b in range(steps_per_epoch):
            if step >= total:
                break
            idx = np.sort(perm[b * args.batch:(b + 1) * args.batch])
            toks, lm = tokens[idx], loss_mask[idx]
            anchors = [sample_anchors(lm[i], args.anchors, gen) for i in range(len(idx))]
            ids, pos, prev, lab, val, anc, A = build_batch(toks, lm, anchors, args.block_size, mask_id)
            feats = torch.from_numpy(np.asarray(feats_all[idx], dtype=np.float32))
            fh = torch.from_numpy(np.asarray(hid_all[idx], dtype=np.float32))
            lr = cosine_lr(step, total, args.warmup, args.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, st = dspark_loss(draft, head_w, feats, fh, ids, pos, prev, lab, val, anc, args.block_size)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            ema = st if ema is None else {k: (0.95 * ema[k] + 0.05 * st[k]) if k != "acc_k" else
                                          [[0.95 * a + 0.05 * b for a, b in zip(ema[k][0], st[k][0])]]
                                          for k in st}
            if step % 25 == 0 or step == total - 1:
                acc = " ".join(f"{a:.2f}" for a in ema["acc_k"][0])
                log(f"draft step {step}/{total} lr {lr:.2e} loss {ema['loss']:.3f} ce {ema['ce']:.3f} "
                    f"tv {ema['tv']:.3f} bce {ema['bce']:.3f} | top1 acc by slot {acc} ({timer():.0f}s)")
                hist.append({"step": step,
                             **{k: (round(v, 4) if k != "acc_k" else [round(a, 3) for a in v[0]])
                                for k, v in ema.items()}})
            step += 1
    os.makedirs(os.path.join(args.out, "draft_torch"), exist_ok=True)
    torch.save({"config": cfg.to_dict(), "state_dict": draft.state_dict()},
               os.path.join(args.out, "draft_torch", "draft.pt"))
    write_json(os.path.join(args.out, "draft_train.json"), {
        "config": cfg.to_dict(), "params_total": count_params(draft),
        "params_trainable": count_params(draft, True),
        "epochs": args.epochs, "steps": total, "batch": args.batch, "anchors": args.anchors, "lr": args.lr,
        "warmup": args.warmup, "weight_decay": args.wd, "init": args.init,
        "seed": args.seed, "loss_weights": {"ce": W_CE, "tv": W_TV, "conf": W_CONF, "decay": DECAY},
        "wall_s": timer(), "history": hist,
    })
    log(f"saved draft ({timer():.0f}s)")


if __name__ == "__main__":
    main()
