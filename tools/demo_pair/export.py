"""Export the trained draft as Hugging Face checkpoints in two formats.

1. DeepSpec dense format (OUT/draft-dspark/): config.json = the target's config plus the DSpark
   fields (architectures ["Qwen3DSparkModel"], flat block_size, target_layer_ids in the DeepSpec
   convention, mask_token_id, markov_rank, markov_head_type "vanilla", enable_confidence_head,
   confidence_head_with_markov, num_target_layers, num_anchors); model.safetensors with
   embed_tokens/lm_head copies of the target, fc, hidden_norm, norm, layers.*,
   markov_head.markov_w1/w2, confidence_head.proj.*.

2. speculators format with a reduced draft vocabulary (OUT/draft-dspark-reduced/):
   architectures ["DSparkDraftModel"], speculators_model_type "dspark", the draft layer config nested
   in transformer_layer_config, aux_hidden_state_layer_ids = DeepSpec ids + 1 (vLLM convention),
   sample_from_anchor true, draft_vocab_size Vd < V. The Vd draft tokens are the Vd most frequent
   supervised tokens of the draft training data (ties broken by the smaller id), sorted by id;
   d2t[j] = target_id(j) - j (int64 offsets), t2d = bool mask over the target vocabulary;
   lm_head.weight and markov_head.markov_w2.weight keep only those rows; markov_w1 stays [V, r].
"""

from __future__ import annotations

import argparse
import copy
import os

import numpy as np
import torch
from safetensors.torch import save_file

from common import log, read_json, write_json
from evaluate import load_draft


def deepspec_config(target_cfg: dict, dc, num_anchors: int) -> dict:
    cfg = copy.deepcopy(target_cfg)
    cfg.update({
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "num_hidden_layers": dc.num_hidden_layers,
        "num_target_layers": dc.num_target_layers,
        "block_size": dc.block_size,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * dc.num_hidden_layers,
        "max_window_layers": dc.num_hidden_layers,
        "mask_token_id": dc.mask_token_id,
        "target_layer_ids": list(dc.target_layer_ids),
        "num_anchors": num_anchors,
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "markov_rank": dc.markov_rank,
        "markov_head_type": "vanilla",
    })
    cfg.pop("_name_or_path", None)
    return cfg


def state_tensors(draft) -> dict:
    sd = {k: v.detach().contiguous().clone() for k, v in draft.state_dict().items()}
    return sd


def select_draft_vocab(out_dir: str, vd: int, vocab: int) -> np.ndarray:
    d = np.load(os.path.join(out_dir, "data", "draft_data.npz"))
    toks, m = d["tokens"], d["loss_mask"].astype(bool)
    counts = np.bincount(toks[m].astype(np.int64), minlength=vocab)
    order = np.lexsort((np.arange(vocab), -counts))  # by count desc, then id asc
    sel = np.sort(order[:vd])
    cover = counts[sel].sum() / max(1, counts.sum())
    return sel, float(cover)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/demo_pair_out")
    ap.add_argument("--draft-vocab", type=int, default=2048)
    args = ap.parse_args(argv)
    draft = load_draft(os.path.join(args.out, "draft_torch", "draft.pt"))
    dc = draft.c
    tdir = os.path.join(args.out, "target")
    tcfg = read_json(os.path.join(tdir, "config.json"))
    train_info = read_json(os.path.join(args.out, "draft_train.json"))
    sd = state_tensors(draft)

    # 1. DeepSpec dense
    ddir = os.path.join(args.out, "draft-dspark")
    os.makedirs(ddir, exist_ok=True)
    write_json(os.path.join(ddir, "config.json"), deepspec_config(tcfg, dc, train_info["anchors"]))
    save_file(sd, os.path.join(ddir, "model.safetensors"), metadata={"format": "pt"})
    log(f"DeepSpec export: {ddir} ({len(sd)} tensors)")

    # 2. speculators, reduced vocabulary
    V = dc.vocab_size
    sel, cover = select_draft_vocab(args.out, args.draft_vocab, V)
    Vd = len(sel)
    d2t = torch.from_numpy(sel.astype(np.int64) - np.arange(Vd, dtype=np.int64))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.from_numpy(sel.astype(np.int64))] = True
    rsd = dict(sd)
    idx = torch.from_numpy(sel.astype(np.int64))
    rsd["lm_head.weight"] = sd["lm_head.weight"][idx].contiguous()
    rsd["markov_head.markov_w2.weight"] = sd["markov_head.markov_w2.weight"][idx].contiguous()
    rsd["d2t"] = d2t
    rsd["t2d"] = t2d
    layer_cfg = {k: tcfg[k] for k in (
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
        "rope_parameters", "attention_bias", "attention_dropout") if k in tcfg}
    layer_cfg.update({
        "num_hidden_layers": dc.num_hidden_layers,
        "layer_types": ["full_attention"] * dc.num_hidden_layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "architectures": ["Qwen3ForCausalLM"],
    })
    scfg = {
        "architectures": ["DSparkDraftModel"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": dc.block_size,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "dspark-ggml-demo-target", "architectures": ["Qwen3ForCausalLM"]},
        },
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": Vd,
        "block_size": dc.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in dc.target_layer_ids],
        "mask_token_id": dc.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": dc.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "dtype": "float32",
        "tie_word_embeddings": False,
    }
    rdir = os.path.join(args.out, "draft-dspark-reduced")
    os.makedirs(rdir, exist_ok=True)
    write_json(os.path.join(rdir, "config.json"), scfg)
    save_file(rsd, os.path.join(rdir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(args.out, "export.json"), {"draft_vocab_size": Vd, "draft_vocab_coverage": cover})
    log(f"speculators export: {rdir} (Vd={Vd}, covers {cover:.4f} of supervised tokens)")


if __name__ == "__main__":
    main()
