"""Measure the converted demo pair in the project's own runtime (ggml): tau, per-position
acceptance and end-to-end speed of speculative vs target-only decoding, on the same held-out code
prompts as evaluate.py.

    python tools/demo_pair/bench_ggml.py [--dir tests/data/tiny_pair] [--threads 2]

Greedy: the draft chain is argmax and tokens are accepted while they match the target's argmax.
T=0.7: draft_mode "probabilistic" (sampled chain, rejection sampling min(1, p/q)).
Results go to stdout and (with --json) to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(REPO, "python", "dspark_ggml", "demo"))
    ap.add_argument("--draft", default="draft-dspark.gguf")
    ap.add_argument("--tokenizer", default="/tmp/demo_pair_out/target/tokenizer.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--max-prompts", type=int, default=0)
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(REPO, "python"))
    from tokenizers import Tokenizer

    from dspark_ggml.context import Context
    from dspark_ggml.draft import DraftContext, DraftModel
    from dspark_ggml.engine import Engine
    from dspark_ggml.model import Model
    from dspark_ggml.sampling import SamplingParams
    from evaluate import heldout_prompts

    tok = Tokenizer.from_file(args.tokenizer)
    prompts = heldout_prompts(tok)
    if args.max_prompts:
        prompts = prompts[:args.max_prompts]
    eog = [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")]
    target = Model(os.path.join(args.dir, "target.gguf"))
    draft = DraftModel(os.path.join(args.dir, args.draft), target)
    n_ctx = 512

    def engine(with_draft, **kw):
        ctx = Context(target, n_ctx=n_ctx, n_threads=args.threads)
        d = DraftContext(draft, n_ctx=n_ctx, n_threads=args.threads) if with_draft else None
        return Engine(ctx, d, eog=eog, **kw)

    res = {"draft": args.draft, "prompts": len(prompts), "max_new": args.max_new, "threads": args.threads}
    for T in [float(x) for x in args.temps.split(",")]:
        mode = "greedy" if T <= 0 else "probabilistic"
        rows = {}
        for name, with_draft in (("target_only", False), ("speculative", True)):
            eng = engine(with_draft, draft_mode=mode) if with_draft else engine(False)
            n_tok, t0 = 0, time.perf_counter()
            outs = []
            for i, p in enumerate(prompts):
                sp = SamplingParams(temperature=T, seed=1000 + i, max_tokens=args.max_new)
                o = eng.generate(p, sp)
                outs.append(o)
                n_tok += len(o)
            dt = time.perf_counter() - t0
            st = eng.stats()
            rows[name] = {"tokens": n_tok, "seconds": round(dt, 3), "tok_s": round(n_tok / dt, 1)}
            if with_draft:
                rows[name].update(tau=round(st.mean_accepted_length, 4),
                                  acceptance_by_position=[round(a, 4) for a in st.acceptance_by_position],
                                  acceptance_rate=round(st.acceptance_rate, 4), steps=st.n_steps,
                                  ms_per_step={"draft": round(st.t_draft_ms / max(1, st.n_steps), 3),
                                               "verify": round(st.t_verify_ms / max(1, st.n_steps), 3),
                                               "host": round(st.t_host_ms / max(1, st.n_steps), 3)})
            else:
                rows[name]["ms_per_token_decode"] = round(1000 * dt / max(1, n_tok), 3)
            rows[name + "_outputs"] = outs
            eng.close()
        same = sum(a == b for a, b in zip(rows["target_only_outputs"], rows["speculative_outputs"]))
        rows.pop("target_only_outputs")
        rows.pop("speculative_outputs")
        rows["speedup"] = round(rows["speculative"]["tok_s"] / rows["target_only"]["tok_s"], 3)
        if T <= 0:
            rows["identical_outputs"] = f"{same}/{len(prompts)}"
        res[f"T={T:g}"] = rows
        print(f"T={T:g}: {json.dumps(rows)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
