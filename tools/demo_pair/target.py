"""Train the demo target: a small Qwen3ForCausalLM on the TRAIN split of the stdlib corpus.

Data: the token stream written by train_tokenizer.py (TRAIN documents and every second chat
sample, each followed by <|endoftext|>, in a seeded shuffled order). Each step draws BATCH windows
of SEQ+1 tokens at uniformly random offsets
(numpy Generator seeded with the seed). Loss = next-token cross-entropy on all positions.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from common import add_optimizer_args, cosine_lr, log, start_step, step_parser, target_tokenizer, write_json

TARGET_CONFIG = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
)


def make_config(eos_id: int):
    from transformers import Qwen3Config

    c = dict(TARGET_CONFIG)
    theta = c.pop("rope_theta")
    cfg = Qwen3Config(
        **c,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_cache=True,
        torch_dtype="float32",
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg


@torch.no_grad()
def eval_loss(model, stream: np.ndarray, seq: int, max_windows: int = 64) -> float:
    model.eval()
    n = min(max_windows, (len(stream) - 1) // seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, 8):
        xs = [torch.from_numpy(stream[j * seq:(j + 1) * seq + 1].astype(np.int64))
              for j in range(i, min(n, i + 8))]
        x = torch.stack(xs)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                 reduction="sum")
        tot += loss.item()
        cnt += x[:, 1:].numel()
    model.train()
    return tot / cnt


def main(argv=None):
    ap = step_parser(seed=1234)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seq", type=int, default=512)
    add_optimizer_args(ap, wd=0.1)
    from transformers import Qwen3ForCausalLM

    args, timer, tdir = start_step(ap, argv)
    tok = target_tokenizer(tdir)
    eos = tok.token_to_id("<|endoftext|>")
    stream = np.load(os.path.join(args.out, "data", "train_stream.npy"))
    held = np.load(os.path.join(args.out, "data", "heldout_stream.npy"))
    log(f"stream: train {len(stream)} tokens, held-out {len(held)} tokens")

    cfg = make_config(eos)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(cfg)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"target params: {nparam}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    rng = np.random.default_rng(args.seed + 1)
    model.train()
    hist = []
    ema = None
    for step in range(args.steps):
        lr = cosine_lr(step, args.steps, args.warmup, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        offs = rng.integers(0, len(stream) - args.seq - 1, size=args.batch)
        x = torch.from_numpy(np.stack([stream[o:o + args.seq + 1] for o in offs]).astype(np.int64))
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            log(f"target step {step}/{args.steps} lr {lr:.2e} loss {loss.item():.3f} ema {ema:.3f} "
                f"({timer():.0f}s)")
            hist.append((step, round(ema, 4)))
    hl = eval_loss(model, held, args.seq)
    tl = eval_loss(model, stream, args.seq)
    log(f"final: train-window loss {tl:.3f}, held-out loss {hl:.3f} (ppl {math.exp(hl):.1f})")
    model.config.use_cache = True
    model.save_pretrained(tdir, safe_serialization=True)
    write_json(os.path.join(args.out, "target_train.json"), {
        "params": nparam, "steps": args.steps, "batch": args.batch, "seq": args.seq, "lr": args.lr,
        "warmup": args.warmup, "weight_decay": args.wd, "seed": args.seed, "train_tokens": int(len(stream)),
        "heldout_tokens": int(len(held)), "tokens_seen": args.steps * args.batch * args.seq,
        "final_train_loss": tl, "heldout_loss": hl, "wall_s": timer(), "history": hist,
    })
    log(f"saved target to {tdir} in {timer():.0f}s")


if __name__ == "__main__":
    main()
