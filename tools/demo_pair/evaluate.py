"""Measure the draft in a speculative-decoding loop of our own (torch), on held-out code prompts.

Prompts: for each HELD-OUT file (corpus.py), in file order, the lines that start a function
(``def `` or ``async def `` after any indentation); we take the 1st, 3rd, 5th ... such line of each
file, up to PER_FILE per file. A prompt is the text of that file up to and including that line,
tokenized, keeping at most the last CTX tokens (so the prompt ends with a ``def ...:`` line and the
model has to write the body).

Loop (anchor-first DSpark, block B): the target prefills the prompt and samples the first token
(the anchor). Each round the draft proposes B tokens from the context features (positions < anchor)
and the anchor; the target scores [anchor, d_0..d_{B-1}] in one pass; drafts are accepted left to
right - greedy: while d_i equals the target argmax; T > 0: standard rejection sampling, accept with
probability min(1, p(d_i)/q(d_i)), on rejection resample from norm(max(p - q, 0)), where p and q
are the target and draft distributions at temperature T - and the round ends with one target token
(the correction, or the bonus from row B when every draft was accepted). tau = accepted + 1 per
round. The target KV cache is cut back to the anchor + accepted drafts, and the draft context grows
by their target features.

Reported: tau (mean over rounds, all prompts pooled), per-position conditional acceptance
P(d_i accepted | d_0..d_{i-1} accepted), the distribution of accepted lengths, whether greedy
speculative output equals plain greedy decoding token for token, and the wall-clock speed of
speculative vs target-only decoding with this same torch code (2 threads unless told).
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import torch
from tokenizers import Tokenizer

import corpus
from common import log, start_step, step_parser, target_tokenizer, write_json
from draft import DraftConfig, DSparkDraft, load_hf_draft
from targetio import FastTarget, load_target

PER_FILE = 3
CTX = 96
DEF_RE = re.compile(r"^[ \t]*(async[ \t]+)?def [^\n]*:[ \t]*$", re.M)


def heldout_prompts(tok: Tokenizer, per_file: int = PER_FILE, ctx: int = CTX) -> list[list[int]]:
    out = []
    for d in corpus.load_docs():
        if not d.heldout:
            continue
        ends = [m.end() for m in DEF_RE.finditer(d.text)]
        for e in ends[::2][:per_file]:
            ids = tok.encode(d.text[:e + 1], add_special_tokens=False).ids  # + the newline
            out.append(ids[-ctx:])
    return out


def load_draft(path: str) -> DSparkDraft:
    if os.path.isdir(path):
        return load_hf_draft(path)
    ck = torch.load(path, map_location="cpu", weights_only=False)
    d = DSparkDraft(DraftConfig(**ck["config"]))
    d.load_state_dict(ck["state_dict"])
    d.eval()
    return d


def _probs(logits, T):
    return torch.softmax(logits / T, dim=-1)


@torch.no_grad()
def target_only(ft: FastTarget, prompt, max_new, T, gen, stop_ids):
    cache = ft.new_cache(1)
    logits, _, _ = ft.forward(torch.tensor([prompt]), cache, want_logits="last")
    out = []
    while len(out) < max_new:
        lg = logits[0, -1]
        t = int(lg.argmax()) if T <= 0 else int(torch.multinomial(_probs(lg, T), 1, generator=gen))
        out.append(t)
        if t in stop_ids:
            break
        logits, _, _ = ft.forward(torch.tensor([[t]]), cache, want_logits="last")
    return out


@torch.no_grad()
def speculative(ft: FastTarget, draft: DSparkDraft, prompt, max_new, T, gen, stop_ids, rounds=None):
    B = draft.c.block_size
    cache = ft.new_cache(1)
    P = len(prompt)
    logits, feats, _ = ft.forward(torch.tensor([prompt]), cache)
    ctx_kv = draft.context_kv(draft.context(feats), torch.arange(P)[None])
    lg = logits[0, -1]
    anchor = int(lg.argmax()) if T <= 0 else int(torch.multinomial(_probs(lg, T), 1, generator=gen))
    out = [anchor]
    pos0 = P
    while len(out) < max_new and anchor not in stop_ids:
        toks, q, conf = draft.propose(ctx_kv, anchor, pos0, temperature=T, generator=gen)
        tl, tf, _ = ft.forward(torch.tensor([[anchor] + toks]), cache)
        tl = tl[0]
        n_acc, new = 0, None
        for i in range(B):
            if T <= 0:
                tgt = int(tl[i].argmax())
                if tgt == toks[i]:
                    n_acc += 1
                    continue
                new = tgt
            else:
                p = _probs(tl[i], T)
                x = toks[i]
                u = float(torch.rand(1, generator=gen))
                if u < min(1.0, float(p[x] / q[i][x].clamp(min=1e-20))):
                    n_acc += 1
                    continue
                resid = (p - q[i]).clamp(min=0)
                resid = resid / resid.sum() if float(resid.sum()) > 0 else p
                new = int(torch.multinomial(resid, 1, generator=gen))
            break
        if new is None:
            lgb = tl[B]
            new = int(lgb.argmax()) if T <= 0 else int(torch.multinomial(_probs(lgb, T), 1, generator=gen))
        acc = toks[:n_acc]
        # stop tokens inside the accepted drafts end the generation there
        for j, t in enumerate(acc):
            if t in stop_ids:
                acc, new = acc[:j], t
                break
        if rounds is not None:
            rounds.append((n_acc, conf))
        cache["len"] = pos0 + len(acc) + 1
        nf = tf[:, :len(acc) + 1]
        new_kv = draft.context_kv(draft.context(nf), torch.arange(pos0, pos0 + len(acc) + 1)[None])
        ctx_kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(ctx_kv, new_kv)]
        out += acc + [new]
        pos0 += len(acc) + 1
        anchor = new
    return out[:max_new]


def summarize(rounds, B):
    n = np.array([r[0] for r in rounds])
    reached = np.array([(n >= i).sum() for i in range(B)])
    accepted = np.array([(n >= i + 1).sum() for i in range(B)])
    return {
        "rounds": int(len(n)),
        "tau": float((n + 1).mean()),
        "per_position_conditional_acceptance": [round(float(a / max(r, 1)), 4)
                                                for a, r in zip(accepted, reached)],
        "per_position_acceptance": [round(float(a / len(n)), 4) for a in accepted],
        "accepted_length_histogram": [int((n == i).sum()) for i in range(B + 1)],
    }


def main(argv=None):
    ap = step_parser(seed=99)
    ap.add_argument("--draft", default=None, help="draft.pt or an exported HF draft directory "
                    "(default OUT/draft_torch/draft.pt)")
    ap.add_argument("--tag", default="", help="results go to OUT/eval{tag}.json")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--max-prompts", type=int, default=0)
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--speed", type=int, default=1, help="also time target-only vs speculative (greedy)")
    args, timer, tdir = start_step(ap, argv)
    tok = target_tokenizer(tdir)
    stop_ids = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    target = load_target(tdir)
    draft = load_draft(args.draft or os.path.join(args.out, "draft_torch", "draft.pt"))
    ft = FastTarget(target, draft.c.target_layer_ids, max_len=1024)
    ft.selftest(target)
    prompts = heldout_prompts(tok)
    if args.max_prompts:
        prompts = prompts[:args.max_prompts]
    log(f"{len(prompts)} held-out prompts")
    B = draft.c.block_size
    res = {"prompts": len(prompts), "max_new": args.max_new, "block_size": B}
    for T in [float(x) for x in args.temps.split(",")]:
        rounds = []
        same = 0
        for i, pr in enumerate(prompts):
            gen = torch.Generator().manual_seed(args.seed + i)
            o = speculative(ft, draft, pr, args.max_new, T, gen, stop_ids, rounds)
            if T <= 0:
                ref = target_only(ft, pr, args.max_new, 0.0, None, stop_ids)
                same += int(o == ref)
        s = summarize(rounds, B)
        if T <= 0:
            s["greedy_outputs_identical_to_target_only"] = f"{same}/{len(prompts)}"
        res[f"T={T:g}"] = s
        log(f"T={T:g}: tau {s['tau']:.3f} over {s['rounds']} rounds; per-position "
            f"{s['per_position_conditional_acceptance']}"
            + (f"; identical {same}/{len(prompts)}" if T <= 0 else ""))
    if args.speed:
        # wall clock, greedy, same prompts; each measured twice alternately, best of two
        sp = prompts[: min(len(prompts), 12)]
        t_base, t_spec, n_base, n_spec = [], [], 0, 0
        for rep in range(2):
            t0 = time.perf_counter()
            nb = sum(len(target_only(ft, p, args.max_new, 0.0, None, set())) for p in sp)
            t1 = time.perf_counter()
            ns = sum(len(speculative(ft, draft, p, args.max_new, 0.0, None, set())) for p in sp)
            t2 = time.perf_counter()
            t_base.append(t1 - t0)
            t_spec.append(t2 - t1)
            n_base, n_spec = nb, ns
        res["torch_speed"] = {
            "prompts": len(sp), "tokens": n_base, "target_only_tok_s": n_base / min(t_base),
            "speculative_tok_s": n_spec / min(t_spec),
            "speedup": (n_spec / min(t_spec)) / (n_base / min(t_base)),
        }
        log(f"torch speed: target-only {n_base / min(t_base):.1f} tok/s, "
            f"speculative {n_spec / min(t_spec):.1f} "
            f"tok/s, speedup {res['torch_speed']['speedup']:.2f}x")
    # the demo prompt
    demo = tok.encode("def fibonacci(n):\n", add_special_tokens=False).ids
    rounds = []
    o = speculative(ft, draft, demo, 96, 0.0, None, stop_ids, rounds)
    res["demo"] = {"prompt": "def fibonacci(n):\n", "text": tok.decode(o, skip_special_tokens=False),
                   **summarize(rounds, B)}
    log(f"demo: tau {res['demo']['tau']:.2f}\n{res['demo']['prompt']}{res['demo']['text']}")
    res["wall_s"] = timer()
    write_json(os.path.join(args.out, f"eval{args.tag}.json"), res)
    return res


if __name__ == "__main__":
    main()
