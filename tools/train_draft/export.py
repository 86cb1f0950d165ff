"""Export (speculators format, reduced vocabulary + d2t), conversion to GGUF with our converter, and
the quick evaluation in our runtime.

The speculators export is the one that converts both with `dspark-ggml convert` and with
llama.cpp's converter: config.json with the layer config nested in `transformer_layer_config`
(Qwen3 layers), `aux_hidden_state_layer_ids` in the layer-input convention (= our capture ids),
`sample_from_anchor: true` (anchor-first), `draft_vocab_size`, and model.safetensors with
`d2t` (int64 offsets: target id = draft id + d2t[draft id]) and `t2d` (bool over the target
vocabulary), `lm_head` [Vd, E], `markov_head.markov_w2` [Vd, r], `markov_head.markov_w1` [V, r].

The confidence calibration (a temperature per block position) goes into config.json as
`confidence_temperatures` (with `confidence_calibration`, how they were fitted); our converter
writes it into the GGUF as `dflash.confidence_temperatures`, which the runtime applies.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch
from safetensors.torch import save_file

from data import log, write_json
from draft_model import DSparkDraft


def export_speculators(draft: DSparkDraft, info, out_dir: str, calibration: dict | None, verifier: str) -> str:
    c = draft.c
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.detach().float().contiguous().clone() for k, v in draft.state_dict().items()}
    ids = draft.vocab_ids.clone()
    Vd = len(ids)
    sd["d2t"] = ids - torch.arange(Vd, dtype=torch.long)
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    sd["t2d"] = t2d
    layer_cfg = {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "max_position_embeddings": info.n_ctx_train, "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "attention_bias": False, "attention_dropout": 0.0,
        "layer_types": ["full_attention"] * c.num_hidden_layers, "use_sliding_window": False,
        "sliding_window": None, "tie_word_embeddings": False,
    }
    cfg = {
        "architectures": ["DSparkDraftModel"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.block_size,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier,
                         "architectures": [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                            "qwen2": "Qwen2ForCausalLM"}[info.arch]]},
        },
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": Vd,
        "block_size": c.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": list(c.capture_ids),
        "mask_token_id": c.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": c.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "dtype": "float32",
        "tie_word_embeddings": False,
    }
    if calibration is not None:
        cfg["confidence_temperatures"] = calibration["temperatures"]
        cfg["confidence_calibration"] = {
            "method": "sequential temperature scaling (DSpark): confidence_k = sigmoid(logit_k / T_k); "
                      "T_k fitted left to right to minimise the ECE of the running product against "
                      "prefix acceptance of the argmax chain on held-out training-style data",
            "ece_raw": calibration["ece_raw"], "ece_calibrated": calibration["ece_calibrated"],
        }
    write_json(os.path.join(out_dir, "config.json"), cfg)
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def convert_draft(spec_dir: str, stub_dir: str, out_path: str, outtype: str, tokenizer_pre: str | None) -> dict:
    from dspark_ggml.convert import convert

    t0 = time.time()
    kw = {"tokenizer_pre": tokenizer_pre} if tokenizer_pre else {}
    path = convert(spec_dir, out_path, outtype=outtype, target_model_dir=stub_dir, force=True,
                   progress=False, **kw)
    return {"path": str(path), "bytes": os.path.getsize(path), "seconds": round(time.time() - t0, 1)}


def evaluate(target: str, draft_gguf: str, prompts: list[list[int]], *, max_tokens: int, threads: int) -> dict:
    """Greedy, one prompt at a time: target alone, then with the draft; τ, acceptance by position,
    tokens/s of each, and whether the outputs are identical (they must be)."""
    import dspark_ggml as dg

    out = {"prompts": len(prompts), "max_tokens": max_tokens}
    runs = {}
    for name, kw in (("target", {}), ("speculative", {"draft_model_path": draft_gguf})):
        llm = dg.LLM(target, n_ctx=4096, n_threads=threads, **kw)
        try:
            res, t_total, n_total = [], 0.0, 0
            steps = accepted = 0
            drafted_at, accepted_at = None, None
            for p in prompts:
                r = llm.generate(p, max_tokens=max_tokens)
                res.append(r.tokens)
                t_total += r.stats.t_decode_ms / 1000.0
                n_total += max(0, r.stats.n_generated - 1)
                steps += r.stats.n_steps
                accepted += r.stats.n_accepted
                if r.stats.drafted_at:
                    drafted_at = np.add(drafted_at, r.stats.drafted_at) if drafted_at is not None else np.array(r.stats.drafted_at)
                    accepted_at = np.add(accepted_at, r.stats.accepted_at) if accepted_at is not None else np.array(r.stats.accepted_at)
            runs[name] = res
            d = {"tokens_per_s": round(n_total / t_total, 1) if t_total else None, "tokens": n_total}
            if name == "speculative":
                d["tau"] = round((accepted + steps) / steps, 3) if steps else None
                d["acceptance_by_position"] = ([round(float(a) / max(float(b), 1.0), 3)
                                                for a, b in zip(accepted_at, drafted_at)]
                                               if drafted_at is not None else [])
                d["steps"] = steps
            out[name] = d
        finally:
            llm.close()
    out["identical_greedy"] = sum(a == b for a, b in zip(runs["target"], runs["speculative"]))
    if out["target"]["tokens_per_s"] and out["speculative"]["tokens_per_s"]:
        out["speedup"] = round(out["speculative"]["tokens_per_s"] / out["target"]["tokens_per_s"], 3)
    log(f"evaluate: τ {out['speculative'].get('tau')} | target {out['target']['tokens_per_s']} tok/s, "
        f"speculative {out['speculative']['tokens_per_s']} tok/s | identical {out['identical_greedy']}/{len(prompts)}")
    return out


def evaluate_isolated(target: str, draft_gguf: str, prompts: list[list[int]], *, max_tokens: int,
                      threads: int, work_dir: str) -> dict:
    """`evaluate` in a child process, so that a runtime abort (a C-level crash cannot be caught
    in Python) is reported as an error instead of killing the recipe."""
    import json
    import subprocess
    import sys

    from gguf_target import RecipeError

    req = os.path.join(work_dir, "evaluate_request.json")
    res = os.path.join(work_dir, "evaluate_result.json")
    write_json(req, {"target": target, "draft": draft_gguf, "prompts": prompts, "max_tokens": max_tokens,
                     "threads": threads, "result": res})
    if os.path.exists(res):
        os.remove(res)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), req], capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0 or not os.path.exists(res):
        tail = (p.stderr or "").strip().splitlines()[-3:]
        raise RecipeError(f"the quick evaluation failed (exit code {p.returncode}) loading or running "
                          f"{draft_gguf} with {target} in our runtime: {' | '.join(tail)}; the draft GGUF is "
                          "written; rerun with --resume to retry the evaluation")
    with open(res) as f:
        return json.load(f)


if __name__ == "__main__":  # the child process of evaluate_isolated
    import json
    import sys

    with open(sys.argv[1]) as f:
        r = json.load(f)
    out = evaluate(r["target"], r["draft"], r["prompts"], max_tokens=r["max_tokens"], threads=r["threads"])
    write_json(r["result"], out)
