"""Hugging Face transformers models built from tiny.py target weights (the HF cross-check oracle).

Needs torch and transformers (the `reference` extra).
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch
import transformers

from tests.tiny_models import LLAMA3_ROPE, TargetConfig



def _hf_rope_parameters(cfg: TargetConfig) -> dict:
    rp: dict = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None and cfg.rope_scaling[0] == "linear":
        rp.update(rope_type="linear", factor=float(cfg.rope_scaling[1]))
    elif cfg.rope_scaling is not None:
        rp.update(rope_type="yarn", factor=float(cfg.rope_scaling[1]),
                  original_max_position_embeddings=int(cfg.rope_scaling[2]))
    if cfg.rope_freqs:  # tiny writes llama3 factors with these constants
        assert cfg.rope_scaling is None
        rp.update(rope_type="llama3", original_max_position_embeddings=cfg.n_ctx_train, **LLAMA3_ROPE)
    return rp


def _unpermute_llama_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF (normal-rope) q/k rows -> HF (rotate_half) rows, per head:
    hf[j] = gguf[2j], hf[j + D/2] = gguf[2j + 1]."""
    rows, cols = w.shape
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _hf_state_dict(w: Dict[str, np.ndarray], cfg: TargetConfig) -> Dict[str, "torch.Tensor"]:
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"],
          "lm_head.weight": w.get("output.weight", w["token_embd.weight"])}
    names = {"attn_norm.weight": "input_layernorm.weight",
             "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
             "attn_v.bias": "self_attn.v_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
             "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
             "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
    for i in range(cfg.n_layer):
        for g, h in names.items():
            if f"blk.{i}.{g}" in w:
                t = w[f"blk.{i}.{g}"]
                if cfg.arch == "llama" and g == "attn_q.weight":
                    t = _unpermute_llama_qk(t, cfg.n_head)
                if cfg.arch == "llama" and g == "attn_k.weight":
                    t = _unpermute_llama_qk(t, cfg.n_head_kv)
                sd[f"model.layers.{i}.{h}"] = t
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def hf_model(w: Dict[str, np.ndarray], cfg: TargetConfig):
    config_cls = {"qwen3": transformers.Qwen3Config, "llama": transformers.LlamaConfig,
                  "qwen2": transformers.Qwen2Config}[cfg.arch]
    model_cls = {"qwen3": transformers.Qwen3ForCausalLM, "llama": transformers.LlamaForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM}[cfg.arch]
    hf_cfg = config_cls(
        vocab_size=cfg.n_vocab, hidden_size=cfg.n_embd, intermediate_size=cfg.n_ff,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head_kv,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.n_ctx_train, rms_norm_eps=cfg.rms_eps,
        rope_parameters=_hf_rope_parameters(cfg), tie_word_embeddings=cfg.tied_embeddings,
        attention_bias=False, hidden_act="silu")
    hf_cfg._attn_implementation = "eager"
    model = model_cls(hf_cfg).float().eval()
    missing, unexpected = model.load_state_dict(_hf_state_dict(w, cfg), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model
