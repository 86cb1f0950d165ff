"""Hugging Face → GGUF tensor names and expected shapes of the decoder layers.

Names follow llama.cpp's (llama-arch.cpp); shapes are in PyTorch order ([out, in] for linear
weights, which GGUF stores as ggml {in, out}).
"""
from __future__ import annotations

import re
from typing import Optional

from .backbone import Backbone

# HF module inside `layers.{i}.` -> GGUF name inside `blk.{i}.`
_LAYER_MODULES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# tensors the converter computes rather than copies
ROPE_FREQS = "rope_freqs.weight"  # per-pair rope frequency divisors
D2T = "d2t"  # absolute target id of each draft-vocabulary row (I64)

_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")


def layer_tensor_name(name: str) -> Optional[tuple[int, str, str]]:
    """`layers.3.self_attn.q_proj.weight` -> (3, "self_attn.q_proj.weight", "blk.3.attn_q.weight").

    The name must already be stripped of any `model.` prefix; None when it is not a layer tensor
    this converter knows."""
    match = _LAYER_NAME.match(name)
    if match is None or match.group(2) not in _LAYER_MODULES:
        return None
    layer, module, kind = int(match.group(1)), match.group(2), match.group(3)
    return layer, f"{module}.{kind}", f"blk.{layer}.{_LAYER_MODULES[module]}.{kind}"


def layer_tensor_shapes(bb: Backbone, *, qk_norm: bool, qkv_bias: bool = False,
                        o_bias: bool = False, mlp_bias: bool = False) -> dict[str, tuple[int, ...]]:
    """Every tensor one layer must have (keys as returned in `layer_tensor_name()[1]`)."""
    q, kv, e, f = bb.n_head * bb.head_dim, bb.kv_heads * bb.head_dim, bb.n_embd, bb.n_ff
    shapes: dict[str, tuple[int, ...]] = {
        "input_layernorm.weight": (e,),
        "self_attn.q_proj.weight": (q, e),
        "self_attn.k_proj.weight": (kv, e),
        "self_attn.v_proj.weight": (kv, e),
        "self_attn.o_proj.weight": (e, q),
        "post_attention_layernorm.weight": (e,),
        "mlp.gate_proj.weight": (f, e),
        "mlp.up_proj.weight": (f, e),
        "mlp.down_proj.weight": (e, f),
    }
    if qk_norm:
        shapes["self_attn.q_norm.weight"] = (bb.head_dim,)
        shapes["self_attn.k_norm.weight"] = (bb.head_dim,)
    if qkv_bias:
        shapes.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                       "self_attn.v_proj.bias": (kv,)})
    if o_bias:
        shapes["self_attn.o_proj.bias"] = (e,)
    if mlp_bias:
        shapes.update({"mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,),
                       "mlp.down_proj.bias": (e,)})
    return shapes
