"""Generate the draft's training data with the target itself (self-distillation data).

Prompts come only from the TRAIN token stream (train_tokenizer.py): for group g we draw
GROUP_SIZE random offsets (numpy Generator seeded with seed + g) and take PROMPT_LENS[g % 5]
tokens from each offset (prompts that contain <|endoftext|> are re-drawn). Every 8th group uses
chat prompts instead: the user turn of a chat sample from TRAIN files followed by
"<|im_start|>assistant\\n", all of one token length (a length drawn among those that have at
least GROUP_SIZE such prompts).

Each prompt is continued by the target for GEN_LEN tokens with a KV cache:
groups with g % 10 in {0..4} greedily, {5..8} at temperature 0.7, {9} at temperature 1.0
(torch.Generator seeded with seed + g). Tokens after the first generated <|endoftext|> or
<|im_end|> get loss_mask 0.

While generating (targetio.FastTarget, a minimal Qwen3 forward checked against HF), we record for
every position the target's hidden states at the DeepSpec target layer ids (the draft's input
features) and the target's final-norm output (from which the teacher distribution is recomputed
with the target head), so draft training never runs the target again.

Output (OUT/data/): draft_data.npz with tokens [N, S] (S = longest prompt + GEN_LEN, right-padded
with <|endoftext|>), prompt_len [N], loss_mask [N, S] (1 on generated tokens), target_layer_ids;
draft_feats.npy [N, S, n*d] fp16; draft_final_hidden.npy [N, S, d] fp16.
"""

from __future__ import annotations

import os

import numpy as np
import torch

import corpus
from common import log, start_step, step_parser, target_tokenizer, write_json
from draft import deepspec_layer_ids
from targetio import FastTarget, load_target

PROMPT_LENS = [8, 24, 48, 96, 128]
TEMPS = [0.0] * 5 + [0.7] * 4 + [1.0]


@torch.no_grad()
def generate(ft: FastTarget, prompts: torch.Tensor, gen_len: int, temperature: float, gen: torch.Generator):
    """Continue `prompts` [G, lp] by gen_len tokens. Returns (continuation [G, gen_len],
    features [G, lp+gen_len, n*d] fp16, final hidden [G, lp+gen_len, d] fp16). The features/hidden of
    the last generated token are never computed (they are never needed) and are left zero."""
    G, lp = prompts.shape
    cache = ft.new_cache(G) if lp + gen_len <= ft.max_len else None
    logits, f, h = ft.forward(prompts, cache)
    feats, hids = [f.half()], [h.half()]
    logits = logits[:, -1]
    toks = []
    for i in range(gen_len):
        if temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
        toks.append(nxt)
        if i + 1 == gen_len:
            break
        logits, f, h = ft.forward(nxt[:, None], cache)
        feats.append(f.half())
        hids.append(h.half())
        logits = logits[:, -1]
    f = torch.cat(feats + [torch.zeros_like(feats[0][:, :1])], dim=1)
    h = torch.cat(hids + [torch.zeros_like(hids[0][:, :1])], dim=1)
    return torch.stack(toks, dim=1), f, h


def main(argv=None):
    ap = step_parser(seed=4321)
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--group-size", type=int, default=80)
    ap.add_argument("--gen-len", type=int, default=160)
    ap.add_argument("--n-layer-ids", type=int, default=3, help="number of target layer ids (= draft layers)")
    args, timer, tdir = start_step(ap, argv)
    tok = target_tokenizer(tdir)
    eos = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    stream = np.load(os.path.join(args.out, "data", "train_stream.npy"))
    chats = corpus.chat_samples(corpus.load_docs())
    chat_prompts = [c[: c.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")] for c in chats]
    chat_by_len = {}
    for e in tok.encode_batch(chat_prompts, add_special_tokens=False):
        if len(e.ids) <= max(PROMPT_LENS):
            chat_by_len.setdefault(len(e.ids), []).append(e.ids)
    model = load_target(tdir)
    layer_ids = deepspec_layer_ids(model.config.num_hidden_layers, args.n_layer_ids)
    ft = FastTarget(model, layer_ids, max_len=max(PROMPT_LENS) + args.gen_len)
    ft.selftest(model)

    S = max(PROMPT_LENS) + args.gen_len
    all_tok, all_plen, all_mask, all_feat, all_hid = [], [], [], [], []
    for g in range(args.groups):
        rng = np.random.default_rng(args.seed + g)
        temp = TEMPS[g % len(TEMPS)]
        if g % 8 == 7:
            # chat prompts of one token length (drawn among lengths with enough prompts)
            lens = sorted(L for L, ids in chat_by_len.items() if len(ids) >= args.group_size)
            lp = int(lens[int(rng.integers(0, len(lens)))])
            pick = rng.choice(len(chat_by_len[lp]), size=args.group_size, replace=False)
            prompts = np.stack([np.asarray(chat_by_len[lp][i], dtype=np.int64) for i in pick])
        else:
            lp = PROMPT_LENS[g % len(PROMPT_LENS)]
            rows = []
            while len(rows) < args.group_size:
                o = int(rng.integers(0, len(stream) - lp))
                w = stream[o:o + lp]
                if (w == eos).any():
                    continue
                rows.append(w.astype(np.int64))
            prompts = np.stack(rows)
        gen = torch.Generator().manual_seed(args.seed + g)
        cont, f, h = generate(ft, torch.from_numpy(prompts), args.gen_len, temp, gen)
        cont = cont.numpy()
        seq = np.concatenate([prompts, cont], axis=1)
        mask = np.zeros_like(seq, dtype=np.uint8)
        for r in range(len(seq)):
            m = np.ones(args.gen_len, dtype=np.uint8)
            stops = np.nonzero((cont[r] == eos) | (cont[r] == im_end))[0]
            if len(stops):
                m[stops[0] + 1:] = 0  # the stop token itself is still a target prediction
            mask[r, lp:] = m
        pad = S - seq.shape[1]
        all_tok.append(np.pad(seq, ((0, 0), (0, pad)), constant_values=eos))
        all_mask.append(np.pad(mask, ((0, 0), (0, pad))))
        all_plen.append(np.full(len(seq), lp, dtype=np.int32))
        all_feat.append(np.pad(f.numpy(), ((0, 0), (0, pad), (0, 0))))
        all_hid.append(np.pad(h.numpy(), ((0, 0), (0, pad), (0, 0))))
        log(f"gen group {g}/{args.groups} prompt_len {lp} T={temp} ({timer():.0f}s)")
    tokens = np.concatenate(all_tok).astype(np.int32)
    loss_mask = np.concatenate(all_mask)
    plen = np.concatenate(all_plen)
    ddir = os.path.join(args.out, "data")
    np.savez(os.path.join(ddir, "draft_data.npz"), tokens=tokens, loss_mask=loss_mask, prompt_len=plen,
             target_layer_ids=np.asarray(layer_ids, dtype=np.int32))
    np.save(os.path.join(ddir, "draft_feats.npy"), np.concatenate(all_feat))
    np.save(os.path.join(ddir, "draft_final_hidden.npy"), np.concatenate(all_hid))
    write_json(os.path.join(args.out, "gen_data.json"), {
        "sequences": int(len(tokens)), "generated_tokens": int(loss_mask.sum()), "seq_len": S,
        "groups": args.groups, "group_size": args.group_size, "gen_len": args.gen_len,
        "prompt_lens": PROMPT_LENS, "temps": TEMPS, "seed": args.seed, "wall_s": timer(),
    })
    log(f"draft data: {len(tokens)} sequences, {int(loss_mask.sum())} supervised tokens ({timer():.0f}s)")
    # a peek at the target's behaviour
    for r in (0, len(tokens) // 2):
        print("----", repr(tok.decode(tokens[r, :plen[r]].tolist(), skip_special_tokens=False)))
        print(tok.decode(tokens[r, plen[r]:].tolist(), skip_special_tokens=False)[:600])


if __name__ == "__main__":
    main()
