"""Gemma-4 tensors: Hugging Face names -> GGUF names and the shapes a config implies.

Names follow llama.cpp's `gemma4` architecture. Unlike Gemma 2/3, Gemma-4's RMSNorm multiplies
by the stored weight itself, so norms are written as stored (no +1). The routed experts stay in
their fused 3-D form: `experts.gate_up_proj` [experts, 2 x expert width, hidden] becomes
`ffn_gate_up_exps.weight` unsplit (the runtime splits the halves), the router's scales become
`ffn_gate_inp.scale` and, per expert, `ffn_down_exps.scale`.

Shapes are in PyTorch order ([out, in] for linear weights, [experts, out, in] for experts).
"""
from __future__ import annotations

from dataclasses import dataclass

from .gemma4 import Gemma4Text

# inside `layers.{i}.` -> inside `blk.{i}.`
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
    # per-layer inputs
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    # routed experts, next to the dense MLP
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}

_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


@dataclass(frozen=True)
class Expected:
    gguf_name: str
    shape: tuple[int, ...]
    required: bool = True


def _layer(g: Gemma4Text, i: int) -> dict[str, tuple[int, ...]]:
    e, d, q = g.n_embd, g.head_dim(i), g.n_head * g.head_dim(i)
    kv, f = g.kv_heads(i) * d, g.n_ff_of(i)
    shapes = {
        "input_layernorm.weight": (e,), "post_attention_layernorm.weight": (e,),
        "pre_feedforward_layernorm.weight": (e,), "post_feedforward_layernorm.weight": (e,),
        "layer_scalar": (1,),
        "self_attn.q_proj.weight": (q, e), "self_attn.q_norm.weight": (d,),
        "self_attn.o_proj.weight": (e, q),
        "mlp.gate_proj.weight": (f, e), "mlp.up_proj.weight": (f, e), "mlp.down_proj.weight": (e, f),
    }
    if g.owns_kv(i):
        shapes.update({"self_attn.k_proj.weight": (kv, e), "self_attn.k_norm.weight": (d,)})
    if g.has_v_proj(i):
        shapes["self_attn.v_proj.weight"] = (kv, e)
    if g.n_embd_per_layer:
        p = g.n_embd_per_layer
        shapes.update({"per_layer_input_gate.weight": (p, e), "per_layer_projection.weight": (e, p),
                       "post_per_layer_input_norm.weight": (e,)})
    if g.experts is not None:
        x, fe = g.experts.count, g.experts.n_ff
        shapes.update({
            "router.proj.weight": (x, e), "router.scale": (e,), "router.per_expert_scale": (x,),
            "experts.gate_up_proj": (x, 2 * fe, e), "experts.down_proj": (x, e, fe),
            "pre_feedforward_layernorm_2.weight": (e,),
            "post_feedforward_layernorm_1.weight": (e,),
            "post_feedforward_layernorm_2.weight": (e,),
        })
    return shapes


def _stale_kv(g: Gemma4Text, i: int) -> dict[str, tuple[int, ...]]:
    """K/V tensors some checkpoints still store for a KV-sharing layer (transformers ignores
    them; llama.cpp's converter writes them): accepted, not required."""
    if g.owns_kv(i):
        return {}
    d, kv, e = g.head_dim(i), g.kv_heads(i) * g.head_dim(i), g.n_embd
    stale = {"self_attn.k_proj.weight": (kv, e), "self_attn.k_norm.weight": (d,)}
    if not (g.k_eq_v and not g.sliding[i]):
        stale["self_attn.v_proj.weight"] = (kv, e)
    return stale


def gguf_layer_name(layer: int, part: str) -> str:
    """GGUF name of one Gemma-4 layer tensor: (3, "layer_scalar") -> "blk.3.layer_output_scale.weight"."""
    return f"blk.{layer}.{_LAYER_NAMES[part]}"


def layer_table(g: Gemma4Text, prefix: str = "layers.") -> dict[str, Expected]:
    """Every decoder-layer tensor of a Gemma-4 stack, by HF name (from `layers.`)."""
    table = {}
    for i in range(g.n_layer):
        for part, shape in _layer(g, i).items():
            table[f"{prefix}{i}.{part}"] = Expected(gguf_layer_name(i, part), shape)
        for part, shape in _stale_kv(g, i).items():
            table[f"{prefix}{i}.{part}"] = Expected(gguf_layer_name(i, part), shape, False)
    return table


def target_table(g: Gemma4Text) -> dict[str, Expected]:
    """Every tensor of a Gemma-4 language model, by HF name without the model prefix
    (`lm_head.weight` is listed under that name)."""
    e = g.n_embd
    table = {"embed_tokens.weight": Expected("token_embd.weight", (g.vocab_size, e)),
             "norm.weight": Expected("output_norm.weight", (e,)),
             "lm_head.weight": Expected("output.weight", (g.vocab_size, e),
                                        required=not g.tie_word_embeddings)}
    if g.n_embd_per_layer:
        width = g.n_layer * g.n_embd_per_layer
        for name, shape in (("embed_tokens_per_layer.weight", (g.vocab_size_per_layer, width)),
                            ("per_layer_model_projection.weight", (width, e)),
                            ("per_layer_projection_norm.weight", (g.n_embd_per_layer,))):
            table[name] = Expected(_GLOBAL_NAMES[name], shape)
    table.update(layer_table(g))
    return table
