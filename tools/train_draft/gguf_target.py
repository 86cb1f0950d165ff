"""What the recipe reads from the target GGUF: hyperparameters, tokenizer facts, and the few tensors
torch needs (embedding, final norm, head, the layers the draft starts from).

The target itself only ever runs in our runtime (generation, capture). Torch gets:

* the token embedding (the draft's frozen input embedding) and the head (tied: the embedding) with
  the final norm, to recompute the teacher distribution from the captured input of the final norm;
* the weights of the target's last decoder layers, to initialise the draft's layers. llama.cpp
  stores Llama's attn_q / attn_k rows permuted for its "normal" rope; they are permuted back here
  to the Hugging Face layout, which is the layout of the draft's (NeoX-rope) Qwen3 layers.

`write_hf_stub` writes the minimum Hugging Face directory our converter needs as
`--target-model-dir` for a draft (config.json, the embedding in model.safetensors, tokenizer.json
and tokenizer_config.json rebuilt from the GGUF's vocabulary): the converter reads targets only
as Hugging Face checkpoints.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

SUPPORTED_ARCHS = ("llama", "qwen3", "qwen2")


class RecipeError(Exception):
    """A clear refusal: bad input, unsupported target, nothing to train on."""


@dataclass
class TargetInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    vocab_size: int
    rms_eps: float
    rope_theta: float
    n_ctx_train: int
    tied: bool
    bos_id: Optional[int]
    eos_id: Optional[int]
    pad_id: Optional[int]
    unk_id: Optional[int]
    tokenizer_pre: Optional[str]
    chat_template: Optional[str]
    control_ids: list = field(default_factory=list)
    token_texts: list = field(default_factory=list)  # only filled for control tokens (id -> text)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # pragma: no cover - older gguf
        return default


def open_reader(path: str):
    from gguf import GGUFReader

    if not os.path.isfile(path):
        raise RecipeError(f"--target {path}: no such file")
    try:
        return GGUFReader(path)
    except Exception as e:
        raise RecipeError(f"--target {path}: not a readable GGUF ({e})") from None


def read_target(path: str, reader=None) -> TargetInfo:
    r = reader or open_reader(path)
    arch = _field(r, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise RecipeError(
            f"--target {path}: architecture {arch!r} cannot be captured by this recipe (it supports "
            f"{', '.join(SUPPORTED_ARCHS)}: dense decoders whose layers the draft can start from and "
            "whose final norm + head torch can recompute)")
    a = arch
    n_embd = int(_field(r, f"{a}.embedding_length"))
    n_head = int(_field(r, f"{a}.attention.head_count"))
    n_head_kv = int(_field(r, f"{a}.attention.head_count_kv", n_head))
    head_dim = int(_field(r, f"{a}.attention.key_length", n_embd // n_head))
    rope_dims = _field(r, f"{a}.rope.dimension_count", head_dim)
    if int(rope_dims) != head_dim:
        raise RecipeError(f"--target {path}: partial rotary embeddings (rope.dimension_count "
                          f"{rope_dims} != head dim {head_dim}) are not supported by this recipe")
    if _field(r, f"{a}.rope.scaling.type") not in (None, "none"):
        raise RecipeError(f"--target {path}: rope scaling ({_field(r, f'{a}.rope.scaling.type')}) is "
                          "not supported by this recipe")
    names = {t.name for t in r.tensors}
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    vocab = int(emb.shape[1])
    tok = r.fields.get("tokenizer.ggml.tokens")
    if tok is None:
        raise RecipeError(f"--target {path}: the GGUF has no tokenizer (tokenizer.ggml.tokens); the "
                          "recipe needs it for the chat template and the draft's conversion")
    if _field(r, "tokenizer.ggml.model") != "gpt2":
        raise RecipeError(f"--target {path}: tokenizer model {_field(r, 'tokenizer.ggml.model')!r}: "
                          "only byte-level BPE (gpt2) targets convert as draft targets")
    template = _field(r, "tokenizer.chat_template")
    if not template:
        raise RecipeError(f"--target {path}: no tokenizer.chat_template; the recipe generates its "
                          "data through the chat template")
    types = r.fields.get("tokenizer.ggml.token_type")
    control = []
    texts = {}
    if types is not None:
        for i, part in enumerate(types.data):
            if int(types.parts[part][0]) == 3:
                control.append(i)
                texts[i] = bytes(tok.parts[tok.data[i]]).decode("utf-8", "replace")
    info = TargetInfo(
        path=os.path.abspath(path), arch=arch,
        n_layer=int(_field(r, f"{a}.block_count")), n_embd=n_embd,
        n_ff=int(_field(r, f"{a}.feed_forward_length")), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, vocab_size=vocab,
        rms_eps=float(_field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(r, f"{a}.rope.freq_base", 10000.0)),
        n_ctx_train=int(_field(r, f"{a}.context_length", 4096)),
        tied="output.weight" not in names,
        bos_id=_field(r, "tokenizer.ggml.bos_token_id"), eos_id=_field(r, "tokenizer.ggml.eos_token_id"),
        pad_id=_field(r, "tokenizer.ggml.padding_token_id"),
        unk_id=_field(r, "tokenizer.ggml.unknown_token_id"),
        tokenizer_pre=_field(r, "tokenizer.ggml.pre"), chat_template=template,
        control_ids=control)
    info.token_texts = texts
    return info


def tensor(reader, name: str) -> np.ndarray:
    """A tensor as float32 in numpy (row-major, last axis = a GGUF row): [out, in] for matrices."""
    from dspark_ggml.quant import dequantize

    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        raise RecipeError(f"the target GGUF has no tensor {name!r}")
    shape = tuple(int(x) for x in reversed(t.shape.tolist()))
    kind = t.tensor_type.name
    if kind == "F32":
        return np.array(t.data, dtype=np.float32).reshape(shape)
    if kind == "F16":
        return np.array(t.data, dtype=np.float16).reshape(shape).astype(np.float32)
    return dequantize(np.ascontiguousarray(t.data).view(np.uint8), kind.lower(), shape)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert-time permute of Llama q/k rows (back to the HF layout)."""
    out_dim = w.shape[0]
    hd = out_dim // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def layer_weights(reader, info: TargetInfo, il: int) -> dict[str, np.ndarray]:
    """Decoder layer il in Hugging Face names (Qwen3 layer parts; q/k norms are ones where the
    target has none). Biases of Qwen2 are dropped (the draft's layers have none)."""
    p = f"blk.{il}."
    q = tensor(reader, p + "attn_q.weight")
    k = tensor(reader, p + "attn_k.weight")
    if info.arch == "llama":
        q = _unpermute(q, info.n_head)
        k = _unpermute(k, info.n_head_kv)
    names = {t.name for t in reader.tensors}
    ones = np.ones(info.head_dim, dtype=np.float32)
    return {
        "input_layernorm.weight": tensor(reader, p + "attn_norm.weight"),
        "self_attn.q_proj.weight": q,
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": tensor(reader, p + "attn_v.weight"),
        "self_attn.o_proj.weight": tensor(reader, p + "attn_output.weight"),
        "self_attn.q_norm.weight": tensor(reader, p + "attn_q_norm.weight")
        if p + "attn_q_norm.weight" in names else ones,
        "self_attn.k_norm.weight": tensor(reader, p + "attn_k_norm.weight")
        if p + "attn_k_norm.weight" in names else ones.copy(),
        "post_attention_layernorm.weight": tensor(reader, p + "ffn_norm.weight"),
        "mlp.gate_proj.weight": tensor(reader, p + "ffn_gate.weight"),
        "mlp.up_proj.weight": tensor(reader, p + "ffn_up.weight"),
        "mlp.down_proj.weight": tensor(reader, p + "ffn_down.weight"),
    }


def layer_biases(reader, il: int) -> dict[str, np.ndarray]:
    names = {t.name for t in reader.tensors}
    out = {}
    for part in ("q", "k", "v"):
        n = f"blk.{il}.attn_{part}.bias"
        if n in names:
            out[part] = tensor(reader, n)
    return out


def head_weights(reader, info: TargetInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(embedding [V, E], head [V, E] (the embedding when tied), final norm [E]) as float32."""
    emb = tensor(reader, "token_embd.weight")
    head = emb if info.tied else tensor(reader, "output.weight")
    return emb, head, tensor(reader, "output_norm.weight")


def choose_mask_token(info: TargetInfo, override: Optional[int]) -> int:
    """The draft's MASK token: --mask-token-id, else a control token the chat never uses (a
    `<mask>`-like one if the vocabulary has it, else the highest-id control token that is not
    bos/eos/pad/unk and not a chat-template marker)."""
    if override is not None:
        if not 0 <= override < info.vocab_size:
            raise RecipeError(f"--mask-token-id {override} is outside the target vocabulary "
                              f"(0 .. {info.vocab_size - 1})")
        return override
    texts = info.token_texts
    for i, t in texts.items():
        if "mask" in t.lower():
            return i
    busy = {info.bos_id, info.eos_id, info.pad_id, info.unk_id}
    template = info.chat_template or ""
    free = [i for i in info.control_ids if i not in busy and texts.get(i, "") not in template]
    if not free:
        raise RecipeError("the target vocabulary has no spare control token for the draft's MASK; "
                          "pass --mask-token-id")
    return max(free)


# ----------------------------------------------------------------------------------------------
# the Hugging Face stub our converter takes as --target-model-dir


def _tokenizer_json(reader, info: TargetInfo) -> dict:
    tok = reader.fields["tokenizer.ggml.tokens"]
    texts = [bytes(tok.parts[i]).decode("utf-8") for i in tok.data]
    merges_f = reader.fields.get("tokenizer.ggml.merges")
    merges = [bytes(merges_f.parts[i]).decode("utf-8") for i in merges_f.data] if merges_f else []
    control = set(info.control_ids)
    vocab = {t: i for i, t in enumerate(texts) if i not in control}
    added = [{"id": i, "content": texts[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in sorted(control)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def hf_config(info: TargetInfo) -> dict:
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}[info.arch]
    cfg = {
        "architectures": [arch], "model_type": info.arch,
        "vocab_size": info.vocab_size, "hidden_size": info.n_embd,
        "intermediate_size": info.n_ff, "num_hidden_layers": info.n_layer,
        "num_attention_heads": info.n_head, "num_key_value_heads": info.n_head_kv,
        "head_dim": info.head_dim, "hidden_act": "silu", "max_position_embeddings": info.n_ctx_train,
        "rms_norm_eps": info.rms_eps, "rope_theta": info.rope_theta,
        "tie_word_embeddings": info.tied, "attention_bias": info.arch == "qwen2",
        "torch_dtype": "float32",
    }
    for role in ("bos", "eos", "pad"):
        v = getattr(info, f"{role}_id")
        if v is not None:
            cfg[f"{role}_token_id"] = int(v)
    return cfg


def write_hf_stub(reader, info: TargetInfo, out_dir: str, emb: np.ndarray, head: np.ndarray) -> str:
    """config.json + model.safetensors (embedding, untied head) + tokenizer files: what
    `dspark_ggml.convert` reads from `--target-model-dir` when it converts a draft."""
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    Path(out_dir, "config.json").write_text(json.dumps(hf_config(info), indent=2) + "\n")
    tensors = {"model.embed_tokens.weight": np.ascontiguousarray(emb, dtype=np.float32)}
    if not info.tied:
        tensors["lm_head.weight"] = np.ascontiguousarray(head, dtype=np.float32)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    Path(out_dir, "tokenizer.json").write_text(json.dumps(_tokenizer_json(reader, info)))
    texts = info.token_texts
    tc = {"chat_template": info.chat_template, "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
          "add_eos_token": False, "model_max_length": info.n_ctx_train}
    for role in ("bos", "eos", "pad", "unk"):
        v = getattr(info, f"{role}_id")
        if v is not None and int(v) in texts:
            tc[f"{role}_token"] = texts[int(v)]
    Path(out_dir, "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
    return out_dir
