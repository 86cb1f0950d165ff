"""Tiny random Hugging Face checkpoints in every format the converter reads.

Each `make_*` function writes one model directory (config.json + model.safetensors, and for
targets the tokenizer files) and returns its path. Everything is seeded, so the same call always
writes the same bytes. Config fields and tensor names/shapes follow each producer's format
(DeepSpec dense, vLLM speculators, SpecForge, z-lab DFlash); the values are random. Drafts built
for a target copy its embedding / lm head where the real trainers do, and use the first id past
the tokenizer as mask token (where the real Qwen3 DSpark mask token sits).

Targets: `make_qwen3_target`, `make_qwen2_target`, `make_llama_target`; built with transformers'
own classes (config.json as transformers writes it, loadable with AutoModelForCausalLM):
`make_gemma4_target` (variants dense / ple / moe), `make_gemma4_conditional_target`,
`make_qwen3moe_target`.
Drafts (need a target directory, whose embedding / head they copy like the real trainers do):
`make_deepspec_dspark`, `make_speculators_dspark`, `make_specforge_dspark`, `make_zlab_dflash`;
for Gemma-4 targets `make_gemma4_dspark` (DeepSpec) and `make_gemma4_speculators_dspark`.

torch is used only to write the files (bf16 needs it); the converter under test never imports it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
    processors, trainers

# Pre-tokenizer split patterns of the real Qwen2/Qwen3 and Llama-3 tokenizers (they differ only in
# how digits are grouped).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, speculative decoding drafts tokens in blocks",
    "a draft model proposes and the target model verifies 123 4567",
    "<think> the anchor token comes first </think>",
]

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class TinyShape:
    """Backbone sizes. Multiples of 32 where q8_0 needs them, so both paths get exercised."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    num_hidden_layers: int = 4
    vocab_size: int = 320  # larger than the tokenizer, like Qwen3's padded vocab
    max_position_embeddings: int = 512


DEFAULT_SHAPE = TinyShape()
DRAFT_LAYERS = 2


# ----------------------------------------------------------------------------------------------
# small helpers


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


class _Weights:
    """Seeded random tensors of one dtype."""

    def __init__(self, seed: int, dtype: str):
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = getattr(torch, dtype)

    def matrix(self, rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=self.gen) * 0.05).to(self.dtype)

    def vector(self, n: int, around: float = 0.0) -> torch.Tensor:
        return (around + torch.randn(n, generator=self.gen) * 0.1).to(self.dtype)


def _save(out_dir: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})


def _prepare(out_dir: Path | str) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


# ----------------------------------------------------------------------------------------------
# tokenizers


def _train_byte_level_bpe(split_pattern: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer)
    return tok


def write_qwen_tokenizer(out_dir: Path) -> dict[str, int]:
    """Byte-level BPE shaped like Qwen2/Qwen3's; returns the special token ids."""
    tok = _train_byte_level_bpe(QWEN2_SPLIT_PATTERN)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<think>", "</think>"])  # added but not special, like Qwen3's
    tok.save(str(out_dir / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>")}
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "model_max_length": 512,
        "chat_template": QWEN_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    })
    ids["n_tokens"] = tok.get_vocab_size()
    return ids


def write_llama3_tokenizer(out_dir: Path) -> dict[str, int]:
    """Byte-level BPE shaped like Llama-3's (BOS added by a TemplateProcessing post-processor)."""
    tok = _train_byte_level_bpe(LLAMA3_SPLIT_PATTERN)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    tok.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "model_max_length": 512,
        "chat_template": LLAMA_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": True,
    })
    ids = {t: tok.token_to_id(t) for t in specials}
    ids["n_tokens"] = tok.get_vocab_size()
    return ids


# ----------------------------------------------------------------------------------------------
# backbone tensors (HF names, [out, in] layout)


def _layer_tensors(w: _Weights, prefix: str, s: TinyShape, *, qk_norm: bool, qkv_bias: bool
                   ) -> dict[str, torch.Tensor]:
    q_out, kv_out = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    t = {
        f"{prefix}input_layernorm.weight": w.vector(s.hidden_size, around=1.0),
        f"{prefix}self_attn.q_proj.weight": w.matrix(q_out, s.hidden_size),
        f"{prefix}self_attn.k_proj.weight": w.matrix(kv_out, s.hidden_size),
        f"{prefix}self_attn.v_proj.weight": w.matrix(kv_out, s.hidden_size),
        f"{prefix}self_attn.o_proj.weight": w.matrix(s.hidden_size, q_out),
        f"{prefix}post_attention_layernorm.weight": w.vector(s.hidden_size, around=1.0),
        f"{prefix}mlp.gate_proj.weight": w.matrix(s.intermediate_size, s.hidden_size),
        f"{prefix}mlp.up_proj.weight": w.matrix(s.intermediate_size, s.hidden_size),
        f"{prefix}mlp.down_proj.weight": w.matrix(s.hidden_size, s.intermediate_size),
    }
    if qk_norm:
        t[f"{prefix}self_attn.q_norm.weight"] = w.vector(s.head_dim, around=1.0)
        t[f"{prefix}self_attn.k_norm.weight"] = w.vector(s.head_dim, around=1.0)
    if qkv_bias:
        t[f"{prefix}self_attn.q_proj.bias"] = w.vector(q_out)
        t[f"{prefix}self_attn.k_proj.bias"] = w.vector(kv_out)
        t[f"{prefix}self_attn.v_proj.bias"] = w.vector(kv_out)
    return t


def _target_tensors(w: _Weights, s: TinyShape, *, qk_norm: bool, qkv_bias: bool, tied: bool
                    ) -> dict[str, torch.Tensor]:
    t = {"model.embed_tokens.weight": w.matrix(s.vocab_size, s.hidden_size),
         "model.norm.weight": w.vector(s.hidden_size, around=1.0)}
    for i in range(s.num_hidden_layers):
        t.update(_layer_tensors(w, f"model.layers.{i}.", s, qk_norm=qk_norm, qkv_bias=qkv_bias))
    if not tied:
        t["lm_head.weight"] = w.matrix(s.vocab_size, s.hidden_size)
    return t


def _common_config(s: TinyShape, dtype: str) -> dict:
    return {
        "attention_dropout": 0.0,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": s.intermediate_size,
        "max_position_embeddings": s.max_position_embeddings,
        "num_attention_heads": s.num_attention_heads,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "rms_norm_eps": 1e-6,
        "dtype": dtype,
        "transformers_version": "5.24.0",
        "use_cache": True,
        "vocab_size": s.vocab_size,
    }


# ----------------------------------------------------------------------------------------------
# targets


def _write_target(out: Path, cfg: dict, seed: int, dtype: str, shape: TinyShape, *, qk_norm: bool,
                  qkv_bias: bool, tied: bool) -> Path:
    """config.json and seeded weights of a Qwen/Llama-style target in ``out``."""
    _write_json(out / "config.json", cfg)
    _save(out, _target_tensors(_Weights(seed, dtype), shape, qk_norm=qk_norm, qkv_bias=qkv_bias, tied=tied))
    return out


def make_qwen3_target(out_dir: Path | str, *, seed: int = 0, dtype: str = "bfloat16",
                      shape: TinyShape = DEFAULT_SHAPE, tie_word_embeddings: bool = False) -> Path:
    """Qwen3ForCausalLM with transformers-5 style `rope_parameters`."""
    out = _prepare(out_dir)
    ids = write_qwen_tokenizer(out)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
           **_common_config(shape, dtype),
           "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
           "max_window_layers": shape.num_hidden_layers, "layer_types":
           ["full_attention"] * shape.num_hidden_layers,
           "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
           "sliding_window": None, "use_sliding_window": False,
           "tie_word_embeddings": tie_word_embeddings}
    return _write_target(out, cfg, seed, dtype, shape, qk_norm=True, qkv_bias=False, tied=tie_word_embeddings)


def make_qwen2_target(out_dir: Path | str, *, seed: int = 1, dtype: str = "float32",
                      shape: TinyShape = DEFAULT_SHAPE, tie_word_embeddings: bool = True) -> Path:
    """Qwen2ForCausalLM (q/k/v biases, no q/k norms), older config style with top-level rope_theta."""
    out = _prepare(out_dir)
    ids = write_qwen_tokenizer(out)
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           **_common_config(shape, dtype),
           "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
           "max_window_layers": shape.num_hidden_layers, "rope_theta": 10000.0,
           "rope_scaling": None, "sliding_window": 4096, "use_sliding_window": False,
           "tie_word_embeddings": tie_word_embeddings}
    del cfg["head_dim"]  # Qwen2 configs derive it from hidden_size / num_attention_heads
    return _write_target(out, cfg, seed, dtype, shape, qk_norm=False, qkv_bias=True, tied=tie_word_embeddings)


def make_llama_target(out_dir: Path | str, *, seed: int = 2, dtype: str = "float16",
                      shape: TinyShape = DEFAULT_SHAPE, llama3_rope: bool = True) -> Path:
    """LlamaForCausalLM shaped like Llama-3.x (llama3 rope scaling, BOS-adding tokenizer)."""
    out = _prepare(out_dir)
    ids = write_llama3_tokenizer(out)
    rope_scaling = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
                    if llama3_rope else None)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           **_common_config(shape, dtype),
           "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
           "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": ids["<|eot_id|>"],
           "rope_theta": 500000.0, "rope_scaling": rope_scaling, "tie_word_embeddings": False}
    return _write_target(out, cfg, seed, dtype, shape, qk_norm=False, qkv_bias=False, tied=False)


# ----------------------------------------------------------------------------------------------
# drafts


@dataclass(frozen=True)
class _TargetView:
    config: dict
    tensors: dict[str, torch.Tensor]
    first_unused_id: int  # first id past the tokenizer: where the real Qwen3 DSpark mask token sits

    @property
    def embed(self) -> torch.Tensor:
        return self.tensors["model.embed_tokens.weight"]

    @property
    def head(self) -> torch.Tensor:
        return self.tensors.get("lm_head.weight", self.embed)

    def draft_shape(self, num_layers: int) -> TinyShape:
        c = self.config
        return TinyShape(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                         num_attention_heads=c["num_attention_heads"],
                         num_key_value_heads=c["num_key_value_heads"],
                         head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
                         num_hidden_layers=num_layers, vocab_size=c["vocab_size"],
                         max_position_embeddings=c["max_position_embeddings"])


def _read_target(target_dir: Path | str) -> _TargetView:
    target = Path(target_dir)
    tokenizer = _read_json(target / "tokenizer.json")
    n_tokens = 1 + max([*tokenizer["model"]["vocab"].values(),
                        *(t["id"] for t in tokenizer["added_tokens"])])
    return _TargetView(_read_json(target / "config.json"),
                       load_file(str(target / "model.safetensors")), n_tokens)


def _draft_backbone(w: _Weights, s: TinyShape, n_target_features: int) -> dict[str, torch.Tensor]:
    """Tensors every DFlash-family draft has (no `model.` prefix, as the trainers save them)."""
    t = {"fc.weight": w.matrix(s.hidden_size, n_target_features * s.hidden_size),
         "hidden_norm.weight": w.vector(s.hidden_size, around=1.0),
         "norm.weight": w.vector(s.hidden_size, around=1.0)}
    for i in range(s.num_hidden_layers):
        t.update(_layer_tensors(w, f"layers.{i}.", s, qk_norm=True, qkv_bias=False))
    return t


def _markov_tensors(w: _Weights, head_type: str, rank: int, hidden: int, n_vocab: int,
                    n_vocab_draft: int) -> dict[str, torch.Tensor]:
    t = {"markov_head.markov_w1.weight": w.matrix(n_vocab, rank),
         "markov_head.markov_w2.weight": w.matrix(n_vocab_draft, rank)}
    if head_type == "gated":
        t["markov_head.gate_proj.weight"] = w.matrix(rank, hidden + rank)
        t["markov_head.gate_proj.bias"] = w.vector(rank)
    elif head_type == "rnn":
        t["markov_head.joint_proj.weight"] = w.matrix(3 * rank, 2 * rank + hidden)
        t["markov_head.joint_proj.bias"] = w.vector(3 * rank)
    elif head_type != "vanilla":
        raise ValueError(f"unknown markov head type {head_type!r}")
    return t


def _confidence_tensors(w: _Weights, hidden: int, rank: int) -> dict[str, torch.Tensor]:
    return {"confidence_head.proj.weight": w.matrix(1, hidden + rank),
            "confidence_head.proj.bias": w.vector(1)}


def _draft_qwen3_config(target: _TargetView, s: TinyShape, dtype: str) -> dict:
    """A draft config is a copy of the target's with the draft depth (DeepSpec, SpecForge, z-lab)."""
    cfg = {"model_type": "qwen3", "attention_bias": False, **_common_config(s, dtype),
           "layer_types": ["full_attention"] * s.num_hidden_layers,
           "max_window_layers": s.num_hidden_layers, "sliding_window": None,
           "use_sliding_window": False, "tie_word_embeddings": False,
           "num_target_layers": target.config["num_hidden_layers"]}
    for key in ("rope_parameters", "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id"):
        if key in target.config:
            cfg[key] = target.config[key]
    return cfg


def make_deepspec_dspark(out_dir: Path | str, target_dir: Path | str, *,
                         head_type: Optional[str] = "vanilla", markov_rank: int = 8,
                         confidence_head: bool = True, block_size: int = 7,
                         target_layer_ids: Sequence[int] = (0, 2), num_layers: int = DRAFT_LAYERS,
                         seed: int = 10, dtype: str = "bfloat16") -> Path:
    """DeepSpec dense `Qwen3DSparkModel` (head_type=None: a DeepSpec DFlash, markov_rank 0).

    Flat config; carries frozen copies of the target embedding and lm head."""
    out = _prepare(out_dir)
    target = _read_target(target_dir)
    s = target.draft_shape(num_layers)
    rank = markov_rank if head_type else 0
    cfg = {"architectures": ["Qwen3DSparkModel"], **_draft_qwen3_config(target, s, dtype),
           "block_size": block_size, "mask_token_id": target.first_unused_id,
           "target_layer_ids": list(target_layer_ids), "num_anchors": 512,
           "enable_confidence_head": bool(confidence_head and head_type), "markov_rank": rank}
    if cfg["enable_confidence_head"]:
        cfg["confidence_head_with_markov"] = True
    if head_type:
        cfg["markov_head_type"] = head_type
    _write_json(out / "config.json", cfg)

    w = _Weights(seed, dtype)
    t = _draft_backbone(w, s, len(target_layer_ids))
    t["embed_tokens.weight"] = target.embed.to(w.dtype).clone()
    t["lm_head.weight"] = target.head.to(w.dtype).clone()
    if head_type:
        t.update(_markov_tensors(w, head_type, rank, s.hidden_size, s.vocab_size, s.vocab_size))
        if confidence_head:
            t.update(_confidence_tensors(w, s.hidden_size, rank))
    _save(out, t)
    return out


def _reduced_vocab(gen: torch.Generator, n_vocab: int, n_draft: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted target ids, d2t offsets, t2d mask) as speculators builds them."""
    ids = torch.randperm(n_vocab, generator=gen)[:n_draft].sort().values
    d2t = (ids - torch.arange(n_draft)).to(torch.int64)
    t2d = torch.zeros(n_vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids, d2t, t2d


def _speculators_config(target_dir: Path | str, layer_cfg: dict, *, block_size: int,
                        sample_from_anchor: Optional[bool], draft_vocab_size: int,
                        aux_hidden_state_layer_ids: Sequence[int], mask_token_id: int, markov_rank: int,
                        head_type: str, confidence_head: bool, dtype: str) -> dict:
    """The config.json of a speculators DSpark export around a draft layer config
    (`sample_from_anchor=None` leaves that field out)."""
    n_spec = block_size if sample_from_anchor else block_size - 1
    cfg = {
        "architectures": ["DSparkDraftModel"],
        "speculators_model_type": "dspark",
        "speculators_version": "0.5.0",
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": n_spec,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(target_dir),
                         "architectures": _read_json(Path(target_dir) / "config.json")["architectures"]},
        },
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": draft_vocab_size,
        "block_size": block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": list(aux_hidden_state_layer_ids),
        "mask_token_id": mask_token_id,
        "sliding_window_non_causal": False,
        "markov_rank": markov_rank,
        "markov_head_type": head_type,
        "enable_confidence_head": confidence_head,
        "confidence_head_with_markov": True,
        "dtype": dtype,
        "transformers_version": "5.24.0",
    }
    if sample_from_anchor is not None:
        cfg["sample_from_anchor"] = sample_from_anchor
    return cfg


def make_speculators_dspark(out_dir: Path | str, target_dir: Path | str, *,
                            draft_vocab_size: Optional[int] = None,
                            sample_from_anchor: Optional[bool] = True,
                            head_type: str = "vanilla", markov_rank: int = 8,
                            confidence_head: bool = True, block_size: int = 8,
                            aux_hidden_state_layer_ids: Sequence[int] = (1, 3),
                            sliding_window: Optional[int] = None,
                            num_layers: int = DRAFT_LAYERS, seed: int = 20,
                            dtype: str = "bfloat16") -> Path:
    """vLLM speculators DSpark export (`DSparkDraftModel`, nested `transformer_layer_config`).

    `draft_vocab_size` < target vocab writes a reduced lm head with `d2t` offsets and `t2d`.
    `sample_from_anchor=None` leaves the field out. `sliding_window` makes every layer a
    sliding-window layer (the speculators default), causal inside the block."""
    out = _prepare(out_dir)
    target = _read_target(target_dir)
    s = target.draft_shape(num_layers)
    n_draft = draft_vocab_size or s.vocab_size
    layer_cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                 "attention_bias": False, **_common_config(s, dtype),
                 "layer_types": ["sliding_attention" if sliding_window else "full_attention"]
                 * s.num_hidden_layers,
                 "sliding_window": sliding_window, "use_sliding_window": bool(sliding_window),
                 "max_window_layers": s.num_hidden_layers, "tie_word_embeddings": False}
    for key in ("rope_parameters", "rope_theta"):
        if key in target.config:
            layer_cfg[key] = target.config[key]
    _write_json(out / "config.json", _speculators_config(
        target_dir, layer_cfg, block_size=block_size, sample_from_anchor=sample_from_anchor,
        draft_vocab_size=n_draft, aux_hidden_state_layer_ids=aux_hidden_state_layer_ids,
        mask_token_id=target.first_unused_id, markov_rank=markov_rank, head_type=head_type,
        confidence_head=confidence_head, dtype=dtype))

    w = _Weights(seed, dtype)
    t = _draft_backbone(w, s, len(aux_hidden_state_layer_ids))
    t["embed_tokens.weight"] = target.embed.to(w.dtype).clone()
    if n_draft < s.vocab_size:
        ids, d2t, t2d = _reduced_vocab(w.gen, s.vocab_size, n_draft)
        t["lm_head.weight"] = target.head[ids].to(w.dtype).clone()
        t["d2t"], t["t2d"] = d2t, t2d
    else:
        t["lm_head.weight"] = target.head.to(w.dtype).clone()
    t.update(_markov_tensors(w, head_type, markov_rank, s.hidden_size, s.vocab_size, n_draft))
    if confidence_head:
        t.update(_confidence_tensors(w, s.hidden_size, markov_rank))
    _save(out, t)
    return out


def make_specforge_dspark(out_dir: Path | str, target_dir: Path | str, *,
                          head_type: str = "vanilla", markov_rank: int = 8,
                          confidence_head: bool = True, block_size: int = 7,
                          target_layer_ids: Sequence[int] = (0, 2), legacy_keys: bool = False,
                          num_layers: int = DRAFT_LAYERS, seed: int = 30,
                          dtype: str = "bfloat16") -> Path:
    """SpecForge DSpark export (`DSparkDraftModel`, nested `dflash_config`, no embedding/head).

    `legacy_keys` stores the heads under the older `logit_head.` prefix."""
    out = _prepare(out_dir)
    target = _read_target(target_dir)
    s = target.draft_shape(num_layers)
    cfg = {"architectures": ["DSparkDraftModel"],
           "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
           **_draft_qwen3_config(target, s, dtype), "block_size": block_size,
           "dflash_config": {"attention_mode": "gqa", "mask_token_id": target.first_unused_id,
                             "target_layer_ids": list(target_layer_ids),
                             "projector_type": "dspark", "markov_rank": markov_rank,
                             "markov_head_type": head_type, "confidence_head_alpha": 1.0,
                             "enable_confidence_head": confidence_head,
                             "confidence_head_with_markov": True}}
    _write_json(out / "config.json", cfg)

    w = _Weights(seed, dtype)
    t = _draft_backbone(w, s, len(target_layer_ids))
    heads = _markov_tensors(w, head_type, markov_rank, s.hidden_size, s.vocab_size, s.vocab_size)
    if confidence_head:
        heads.update(_confidence_tensors(w, s.hidden_size, markov_rank))
    prefix = "logit_head." if legacy_keys else ""
    t.update({prefix + k: v for k, v in heads.items()})
    _save(out, t)
    return out


def make_zlab_dflash(out_dir: Path | str, target_dir: Path | str, *, block_size: int = 16,
                     target_layer_ids: Sequence[int] = (0, 2), num_layers: int = DRAFT_LAYERS,
                     seed: int = 40, dtype: str = "bfloat16") -> Path:
    """z-lab DFlash (`DFlashDraftModel`): backbone only, no Markov or confidence head."""
    out = _prepare(out_dir)
    target = _read_target(target_dir)
    s = target.draft_shape(num_layers)
    cfg = {"architectures": ["DFlashDraftModel"],
           "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           **_draft_qwen3_config(target, s, dtype), "block_size": block_size,
           "dflash_config": {"mask_token_id": target.first_unused_id,
                             "target_layer_ids": list(target_layer_ids)}}
    _write_json(out / "config.json", cfg)
    _save(out, _draft_backbone(_Weights(seed, dtype), s, len(target_layer_ids)))
    return out


# ----------------------------------------------------------------------------------------------
# Gemma-4 and Qwen3-MoE (built with transformers' own model classes, so that config.json is what
# transformers writes and `AutoModelForCausalLM.from_pretrained` loads the directory back)

GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0-4, as in Gemma's vocab
GEMMA4_CONTROL = ["<|turn>", "<turn|>", "<|channel>", "<channel|>"]  # in the trained vocab
GEMMA4_EXTRA = ["<|image|>"]  # special, added past the trained vocab
GEMMA4_USER_DEFINED = ["<note>"]  # added past the trained vocab, not special
GEMMA4_MASK_TOKEN_ID = 4  # `<mask>`, the mask token of DeepSpec's Gemma-4 drafts
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def write_gemma4_tokenizer(out_dir: Path) -> dict[str, int]:
    """SentencePiece-style BPE shaped like Gemma's tokenizer.json: byte fallback, spaces as U+2581,
    no prefix space, BOS added by the post-processor; about 400 tokens.

    Readable both by transformers' GemmaTokenizer (which llama.cpp's converter uses through
    gguf's LlamaHfVocab) and as plain JSON (ours)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, limit_alphabet=40,
                                  special_tokens=GEMMA4_SPECIALS + byte_tokens + GEMMA4_CONTROL)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA4_EXTRA])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GEMMA4_USER_DEFINED])
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", bos)])
    tok.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
        "mask_token": "<mask>",
        "extra_special_tokens": ["<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|image|>"],
        "add_bos_token": True, "add_eos_token": False,
        "padding_side": "left", "model_max_length": 512,
        "chat_template": GEMMA4_CHAT_TEMPLATE,
    })
    ids = {t: tok.token_to_id(t) for t in GEMMA4_SPECIALS + GEMMA4_CONTROL + GEMMA4_EXTRA}
    ids["n_tokens"] = tok.get_vocab_size()
    return ids


def _fill_seeded(model: "torch.nn.Module", seed: int, dtype: str) -> None:
    """Overwrite every saved parameter and buffer with seeded values that keep a forward pass
    sensitive to each of them: norms, layer scalars and router scales are not all ones."""
    gen = torch.Generator().manual_seed(seed)
    state = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in sorted(state):
            t = state[name]
            if not t.is_floating_point():
                continue
            noise = torch.randn(t.shape, generator=gen)
            if name.endswith("layer_scalar"):
                value = 0.6 + 0.8 * torch.rand(t.shape, generator=gen)
            elif name.endswith(("norm.weight", "router.scale", "per_expert_scale")) \
                    or "layernorm" in name:
                value = 1.0 + 0.2 * noise
            elif "embed_tokens" in name:
                value = 0.1 * noise
            else:
                value = 0.05 * noise
            t.copy_(value.to(t.dtype))
    model.to(getattr(torch, dtype))


GEMMA4_VARIANTS = ("dense", "ple", "moe")


def gemma4_text_config(variant: str, vocab_size: int, ids: dict[str, int]) -> dict:
    """Gemma4TextConfig arguments of a tiny target.

    dense: 6 layers [s, s, f, s, s, f], window 8, sliding head dim 16 with 2 KV heads, global
      head dim 32 with 1 KV head and K = V (attention_k_eq_v), the last 2 layers share KV,
      final logit soft-capping 30; proportional rope (1/4 of the global head rotated).
    ple: dense + per-layer inputs (16 per layer) and double-wide MLPs on the KV-sharing layers.
    moe: dense + 4 experts (top 2, expert width 32) next to the dense MLP on every layer."""
    if variant not in GEMMA4_VARIANTS:
        raise ValueError(f"unknown Gemma-4 variant {variant!r} (choose from {GEMMA4_VARIANTS})")
    cfg = {
        "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        "sliding_window": 8, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "attention_k_eq_v": True,
        "num_kv_shared_layers": 2, "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": vocab_size,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
        "pad_token_id": ids["<pad>"], "eos_token_id": ids["<eos>"], "bos_token_id": ids["<bos>"],
    }
    if variant == "ple":
        cfg.update(hidden_size_per_layer_input=16, use_double_wide_mlp=True)
    if variant == "moe":
        cfg.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    return cfg


def make_gemma4_target(out_dir: Path | str, variant: str = "dense", *, seed: int = 50,
                       dtype: str = "bfloat16", **overrides: Any) -> Path:
    """Gemma4ForCausalLM (`gemma4_text`), see `gemma4_text_config` for the variants; `overrides`
    replace config fields."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    out = _prepare(out_dir)
    ids = write_gemma4_tokenizer(out)
    config = Gemma4TextConfig(**{**gemma4_text_config(variant, ids["n_tokens"], ids), **overrides})
    model = Gemma4ForCausalLM(config)
    _fill_seeded(model, seed + GEMMA4_VARIANTS.index(variant), dtype)
    model.save_pretrained(str(out))
    return out


def make_gemma3_target(out_dir: Path | str, *, seed: int = 80, dtype: str = "float32",
                       **overrides: Any) -> Path:
    """Gemma3ForCausalLM (`gemma3_text`): 7 layers, the sixth global and the rest sliding (window 8,
    as transformers' period 6 lays them out), head size 32 with 2 KV heads, rope bases 1e6 / 1e4,
    norms away from Gemma's zero init (the converter adds the 1); Gemma's tokenizer shape."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    out = _prepare(out_dir)
    ids = write_gemma4_tokenizer(out)
    fields = dict(vocab_size=ids["n_tokens"], hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
                  sliding_window=8, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"],
                  tie_word_embeddings=True)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**{**fields, **overrides}))
    _fill_seeded(model, seed, dtype)
    with torch.no_grad():  # Gemma-3 norms scale by 1 + w: the seeded 1 + 0.2·noise becomes 0.2·noise
        for name, t in model.state_dict(keep_vars=True).items():
            if name.endswith("norm.weight"):
                t.sub_(1.0)
    model.save_pretrained(str(out))
    return out


def _tiny_gemma4_vision_config() -> dict:
    return {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4,
            "pooling_kernel_size": 2, "position_embedding_size": 64,
            "max_position_embeddings": 256}


def make_gemma4_conditional_target(out_dir: Path | str, *, variant: str = "dense",
                                   seed: int = 60, dtype: str = "bfloat16") -> Path:
    """Gemma4ForConditionalGeneration: the text model of `variant` under
    `model.language_model.`, plus a one-layer vision tower and its embedder (which a text
    GGUF leaves out)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    out = _prepare(out_dir)
    ids = write_gemma4_tokenizer(out)
    config = Gemma4Config(text_config=gemma4_text_config(variant, ids["n_tokens"], ids),
                          vision_config=_tiny_gemma4_vision_config(),
                          image_token_id=ids["<|image|>"], boi_token_id=ids["<|turn>"],
                          eoi_token_id=ids["<turn|>"], tie_word_embeddings=True)
    model = Gemma4ForConditionalGeneration(config)
    _fill_seeded(model, seed, dtype)
    model.save_pretrained(str(out))
    return out


def make_qwen3moe_target(out_dir: Path | str, *, seed: int = 70, dtype: str = "bfloat16") -> Path:
    """Qwen3MoeForCausalLM: 4 layers, every one sparse (decoder_sparse_step 1, no mlp_only
    layers), 8 experts of width 32, top 2 with normalised weights; saved per expert, as
    transformers and the published checkpoints store them."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = _prepare(out_dir)
    ids = write_qwen_tokenizer(out)
    s = DEFAULT_SHAPE
    config = Qwen3MoeConfig(
        vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
        moe_intermediate_size=32, num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads, num_key_value_heads=s.num_key_value_heads,
        head_dim=s.head_dim, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=s.max_position_embeddings,
        rms_norm_eps=1e-6, rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"])
    model = Qwen3MoeForCausalLM(config)
    _fill_seeded(model, seed, dtype)
    model.save_pretrained(str(out))
    return out


def _gemma4_text_of(target_dir: Path | str) -> dict:
    """The text config of a Gemma-4 target (nested under text_config for the conditional model)."""
    cfg = _read_json(Path(target_dir) / "config.json")
    return cfg.get("text_config", cfg)


def _gemma4_target_tensors(target_dir: Path | str) -> dict[str, torch.Tensor]:
    """Target tensors without the `model.` / `model.language_model.` prefix."""
    out = {}
    for name, t in load_file(str(Path(target_dir) / "model.safetensors")).items():
        for prefix in ("model.language_model.", "model."):
            if name.startswith(prefix):
                out[name[len(prefix):]] = t
                break
        else:
            out[name] = t
    return out


def _gemma4_global_attention(text: dict) -> tuple[int, int]:
    """(head dim, KV heads) of the target's full-attention layers."""
    full = text["layer_types"].index("full_attention")
    layer = (text.get("per_layer_config") or {}).get(str(full), {})
    return (layer.get("head_dim", text.get("global_head_dim")),
            layer.get("num_key_value_heads", text.get("num_global_key_value_heads")))


def _gemma4_draft_layer_config(text: dict, num_layers: int) -> dict:
    """A Gemma-4 draft backbone: the target's text config, `num_layers` full-attention layers of
    the target's global head dim and KV heads, K = V, no KV sharing, no PLE, no MoE."""
    head_dim, kv_heads = _gemma4_global_attention(text)
    cfg = {k: v for k, v in text.items() if k not in ("per_layer_config", "architectures")}
    cfg.update(num_hidden_layers=num_layers, layer_types=["full_attention"] * num_layers,
               global_head_dim=head_dim, num_global_key_value_heads=kv_heads,
               attention_k_eq_v=True, num_kv_shared_layers=0, hidden_size_per_layer_input=0,
               enable_moe_block=False, num_experts=None, top_k_experts=None,
               moe_intermediate_size=None, use_double_wide_mlp=False,
               final_logit_softcapping=None, tie_word_embeddings=False)
    return cfg


def _gemma4_draft_tensors(w: _Weights, cfg: dict, n_features: int) -> dict[str, torch.Tensor]:
    """fc / norms / layers of a Gemma-4 DSpark draft (names as DeepSpec saves them)."""
    e, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d, kv, f = cfg["global_head_dim"], cfg["num_global_key_value_heads"], cfg["intermediate_size"]
    t = {"fc.weight": w.matrix(e, n_features * e),
         "hidden_norm.weight": w.vector(e, around=1.0), "norm.weight": w.vector(e, around=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        t.update({
            f"{p}input_layernorm.weight": w.vector(e, around=1.0),
            f"{p}post_attention_layernorm.weight": w.vector(e, around=1.0),
            f"{p}pre_feedforward_layernorm.weight": w.vector(e, around=1.0),
            f"{p}post_feedforward_layernorm.weight": w.vector(e, around=1.0),
            f"{p}layer_scalar": (0.6 + 0.8 * torch.rand(1, generator=w.gen)).to(w.dtype),
            f"{p}self_attn.q_proj.weight": w.matrix(heads * d, e),
            f"{p}self_attn.k_proj.weight": w.matrix(kv * d, e),  # also V (attention_k_eq_v)
            f"{p}self_attn.o_proj.weight": w.matrix(e, heads * d),
            f"{p}self_attn.q_norm.weight": w.vector(d, around=1.0),
            f"{p}self_attn.k_norm.weight": w.vector(d, around=1.0),
            f"{p}mlp.gate_proj.weight": w.matrix(f, e),
            f"{p}mlp.up_proj.weight": w.matrix(f, e),
            f"{p}mlp.down_proj.weight": w.matrix(e, f),
        })
    return t


def make_gemma4_dspark(out_dir: Path | str, target_dir: Path | str, *,
                       head_type: str = "vanilla", markov_rank: int = 8,
                       confidence_head: bool = True, block_size: int = 7,
                       target_layer_ids: Sequence[int] = (1, 3), num_layers: int = DRAFT_LAYERS,
                       final_logit_softcapping: Optional[float] = None, seed: int = 80,
                       dtype: str = "bfloat16") -> Path:
    """DeepSpec `Gemma4DSparkModel` for a Gemma-4 target: flat config copied from the target's
    text config (`global_head_dim` / `num_global_key_value_heads` written out, as DeepSpec's
    transformers 5.10 config does), uniform full-attention layers with K = V, embedding and lm
    head copied from the target, mask token `<mask>` (id 4), anchor-first blocks.

    `final_logit_softcapping` keeps the target's soft-capping in the draft config (what a real
    copy of a Gemma-4 config carries; llama.cpp's converter refuses it)."""
    out = _prepare(out_dir)
    text = _gemma4_text_of(target_dir)
    target = _gemma4_target_tensors(target_dir)
    cfg = {"architectures": ["Gemma4DSparkModel"], **_gemma4_draft_layer_config(text, num_layers),
           "model_type": "gemma4_text", "target_model_type": "gemma4_text",
           "target_text_model_type": "gemma4_text", "num_target_layers": text["num_hidden_layers"],
           "block_size": block_size, "mask_token_id": GEMMA4_MASK_TOKEN_ID,
           "target_layer_ids": list(target_layer_ids), "num_anchors": 512,
           "enable_confidence_head": confidence_head, "markov_rank": markov_rank,
           "markov_head_type": head_type, "dtype": dtype}
    if confidence_head:
        cfg["confidence_head_with_markov"] = True
    if final_logit_softcapping is not None:
        cfg["final_logit_softcapping"] = final_logit_softcapping
    _write_json(out / "config.json", cfg)

    w = _Weights(seed, dtype)
    t = _gemma4_draft_tensors(w, cfg, len(target_layer_ids))
    embed = target["embed_tokens.weight"]
    t["embed_tokens.weight"] = embed.to(w.dtype).clone()
    t["lm_head.weight"] = target.get("lm_head.weight", embed).to(w.dtype).clone()
    e, v = cfg["hidden_size"], cfg["vocab_size"]
    t.update(_markov_tensors(w, head_type, markov_rank, e, v, v))
    if confidence_head:
        t.update(_confidence_tensors(w, e, markov_rank))
    _save(out, t)
    return out


def make_gemma4_speculators_dspark(out_dir: Path | str, target_dir: Path | str, *,
                                   draft_vocab_size: Optional[int] = 128,
                                   sample_from_anchor: bool = False, head_type: str = "vanilla",
                                   markov_rank: int = 8, confidence_head: bool = True,
                                   block_size: int = 8,
                                   aux_hidden_state_layer_ids: Sequence[int] = (2, 4),
                                   num_layers: int = DRAFT_LAYERS, seed: int = 90,
                                   dtype: str = "bfloat16") -> Path:
    """speculators DSpark export for a Gemma-4 target: Gemma-4 draft layers in a nested
    `transformer_layer_config` (as transformers 5.24 serialises a Gemma4TextConfig, with
    `per_layer_config`), `aux_hidden_state_layer_ids`, the 1+N block (sample_from_anchor false)
    and a reduced draft vocabulary with d2t / t2d."""
    from transformers import Gemma4TextConfig

    out = _prepare(out_dir)
    text = _gemma4_text_of(target_dir)
    target = _gemma4_target_tensors(target_dir)
    flat = _gemma4_draft_layer_config(text, num_layers)
    layer_cfg = Gemma4TextConfig(**{k: v for k, v in flat.items()
                                    if k not in ("model_type", "transformers_version", "dtype")})
    layer_cfg = {"architectures": ["Gemma4ForCausalLM"], **layer_cfg.to_diff_dict()}
    n_vocab = flat["vocab_size"]
    n_draft = draft_vocab_size or n_vocab
    _write_json(out / "config.json", _speculators_config(
        target_dir, layer_cfg, block_size=block_size, sample_from_anchor=sample_from_anchor,
        draft_vocab_size=n_draft, aux_hidden_state_layer_ids=aux_hidden_state_layer_ids,
        mask_token_id=GEMMA4_MASK_TOKEN_ID, markov_rank=markov_rank, head_type=head_type,
        confidence_head=confidence_head, dtype=dtype))

    w = _Weights(seed, dtype)
    t = _gemma4_draft_tensors(w, flat, len(aux_hidden_state_layer_ids))
    embed = target["embed_tokens.weight"]
    head = target.get("lm_head.weight", embed)
    t["embed_tokens.weight"] = embed.to(w.dtype).clone()
    if n_draft < n_vocab:
        ids, d2t, t2d = _reduced_vocab(w.gen, n_vocab, n_draft)
        t["lm_head.weight"] = head[ids].to(w.dtype).clone()
        t["d2t"], t["t2d"] = d2t, t2d
    else:
        t["lm_head.weight"] = head.to(w.dtype).clone()
    t.update(_markov_tensors(w, head_type, markov_rank, flat["hidden_size"], n_vocab, n_draft))
    if confidence_head:
        t.update(_confidence_tensors(w, flat["hidden_size"], markov_rank))
    _save(out, t)
    return out


def edit_config(model_dir: Path | str, **changes) -> None:
    """Overwrite (value) or delete (None) top-level config.json fields; for negative tests."""
    path = Path(model_dir) / "config.json"
    cfg = _read_json(path)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    _write_json(path, cfg)


__all__ = [
    "TinyShape", "DEFAULT_SHAPE", "make_qwen3_target", "make_qwen2_target", "make_llama_target",
    "make_deepspec_dspark", "make_speculators_dspark", "make_specforge_dspark", "make_zlab_dflash",
    "edit_config", "write_qwen_tokenizer", "write_llama3_tokenizer",
    "GEMMA4_VARIANTS", "gemma4_text_config", "make_gemma4_target", "make_gemma4_conditional_target",
    "make_qwen3moe_target", "make_gemma4_dspark", "make_gemma4_speculators_dspark",
    "write_gemma4_tokenizer",
]


def make_base_checkpoints(root: Path) -> dict[str, Path]:
    """The Qwen3, Qwen2 and Llama targets and a DeepSpec DSpark draft of the Qwen3 one, in root/<name>."""
    qwen3 = make_qwen3_target(root / "qwen3")
    return {"qwen3": qwen3, "qwen2": make_qwen2_target(root / "qwen2"),
            "llama": make_llama_target(root / "llama"), "deepspec": make_deepspec_dspark(root / "deepspec", qwen3)}
