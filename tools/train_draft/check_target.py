"""Check what the recipe reads from a target GGUF against the runtime: a plain torch forward of the
whole target (weights read and un-permuted by gguf_target.py) must reproduce the residual streams
our runtime captures and its logits. Slow-ish (the whole target in torch); a few tokens only.

    python tools/train_draft/check_target.py --target /work/models/smol-F16.gguf
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_target as gt  # noqa: E402


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    D = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    fr = pos.float()[:, None] * inv
    emb = torch.cat([fr, fr], -1)
    d = D // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], -1)
    return x * emb.cos()[:, None] + rot * emb.sin()[:, None]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import dspark_ggml as dg

    r = gt.open_reader(args.target)
    info = gt.read_target(args.target, r)
    emb, head, fnorm = (torch.from_numpy(a) for a in gt.head_weights(r, info))
    toks = [1, 9690, 198, 2683, 359, 253, 5356, 2, 198, 1, 4093, 198, 22, 11, 13, 28]
    toks = [t % info.vocab_size for t in toks]
    T = len(toks)
    pos = torch.arange(T)
    x = emb[torch.tensor(toks)]
    ids = [1, info.n_layer // 2, info.n_layer]
    states = {0: x.clone()}
    H, Hk, D = info.n_head, info.n_head_kv, info.head_dim
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for il in range(info.n_layer):
        w = {k: torch.from_numpy(v) for k, v in gt.layer_weights(r, info, il).items()}
        b = {k: torch.from_numpy(v) for k, v in gt.layer_biases(r, il).items()}
        h = rms(x, w["input_layernorm.weight"], info.rms_eps)
        q = h @ w["self_attn.q_proj.weight"].t() + b.get("q", 0)
        k = h @ w["self_attn.k_proj.weight"].t() + b.get("k", 0)
        v = h @ w["self_attn.v_proj.weight"].t() + b.get("v", 0)
        q, k, v = q.view(T, H, D), k.view(T, Hk, D), v.view(T, Hk, D)
        if info.arch == "qwen3":
            q = rms(q, w["self_attn.q_norm.weight"], info.rms_eps)
            k = rms(k, w["self_attn.k_norm.weight"], info.rms_eps)
        q, k = rope(q, pos, info.rope_theta), rope(k, pos, info.rope_theta)
        k = k.repeat_interleave(H // Hk, 1)
        v = v.repeat_interleave(H // Hk, 1)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        x = x + o.transpose(0, 1).reshape(T, H * D) @ w["self_attn.o_proj.weight"].t()
        h = rms(x, w["post_attention_layernorm.weight"], info.rms_eps)
        m = torch.nn.functional.silu(h @ w["mlp.gate_proj.weight"].t()) * (h @ w["mlp.up_proj.weight"].t())
        x = x + m @ w["mlp.down_proj.weight"].t()
        states[il + 1] = x.clone()
    logits = rms(x, fnorm, info.rms_eps) @ head.t()

    model = dg.Model(args.target)
    ctx = dg.Context(model, n_ctx=256, n_batch=64, n_threads=args.threads)
    ctx.set_capture_layers(ids)
    ctx.decode(toks, outputs=[True] * T)
    cap = ctx.get_captured(copy=True).reshape(T, len(ids), info.n_embd)
    rl = ctx.get_logits(copy=True)
    ok = True
    for j, i in enumerate(ids):
        ref = states[i].numpy()
        err = np.abs(cap[:, j] - ref).max() / (np.abs(ref).max() + 1e-6)
        print(f"layer input {i}: max rel err {err:.2e}")
        ok &= err < 5e-2
    agree = (rl.argmax(-1) == logits.numpy().argmax(-1)).mean()
    lerr = np.abs(rl - logits.numpy()).max()
    print(f"logits: argmax agreement {agree:.3f}, max abs err {lerr:.3f}")
    ok &= agree >= 0.9
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
