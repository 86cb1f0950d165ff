"""Gemma-4 targets: `Gemma4ForCausalLM` and the text model of `Gemma4ForConditionalGeneration`,
written as llama.cpp's `gemma4` architecture.

The conditional model keeps its language model under `model.language_model.` and its text
hyperparameters in `text_config` (read over the top-level fields, as llama.cpp does); its vision
and audio towers and their embedders are not part of a text GGUF and are left out. A tied model
has no `output.weight` (the runtime uses the embedding).
"""
from __future__ import annotations

from gguf import GGMLQuantizationType

from .errors import ConversionError
from .gemma4 import Gemma4Text, read_gemma4, rope_freqs, write_gemma4_kv
from .gemma4_tensors import target_table
from .hf_config import Config
from .metadata import KeyValues
from .plan import ArrayTensor, ModelPlan, PlannedTensor, StoredTensor
from .quant import OutType, tensor_type
from .safetensors_io import FLOAT_DTYPES, Checkpoint, TensorRef, tensors_equal
from .tensor_names import ROPE_FREQS

ARCH = "gemma4"
CONDITIONAL = "Gemma4ForConditionalGeneration"
# where the language model's tensors live, by architecture
TEXT_PREFIX = {"Gemma4ForCausalLM": "model.", CONDITIONAL: "model.language_model."}
_MULTIMODAL = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
               "model.embed_audio.")


def text_config(cfg: Config) -> Config:
    """The text hyperparameters: the config itself, or the conditional model's text_config
    read over its top-level fields."""
    if cfg.architecture() != CONDITIONAL:
        return cfg
    text = cfg.sub("text_config")
    if text is None:
        raise ConversionError(f"{cfg.where}: {CONDITIONAL} config without text_config")
    return Config({**cfg.data, **text.data}, text.where)


def _hf_key(name: str, prefix: str) -> str | None:
    """Checkpoint name -> key of the tensor table (None: not a language-model tensor)."""
    if name == "lm_head.weight":
        return name
    return name[len(prefix):] if name.startswith(prefix) else None


def _check_tied_head(ckpt: Checkpoint, g: Gemma4Text, prefix: str, where: str) -> None:
    head = ckpt.get("lm_head.weight")
    if g.tie_word_embeddings and head is not None and not tensors_equal(
            head, ckpt[prefix + "embed_tokens.weight"]):
        raise ConversionError(f"{where}: tie_word_embeddings is true but lm_head.weight differs "
                              "from the embedding; fix tie_word_embeddings in the config")


def _planned(ref: TensorRef, gguf_name: str, out: OutType) -> PlannedTensor:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
    return PlannedTensor(gguf_name, StoredTensor(ref), tensor_type(gguf_name, ref.shape, out))


def plan_gemma4_target(ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, Gemma4Text]:
    text = text_config(cfg)
    g = read_gemma4(text)
    kv = KeyValues(ARCH)
    write_gemma4_kv(g, kv)
    plan = ModelPlan(ARCH, kv)
    freqs = rope_freqs(g)
    if freqs is not None:
        plan.add(PlannedTensor(ROPE_FREQS, ArrayTensor(freqs), GGMLQuantizationType.F32))

    prefix = TEXT_PREFIX[cfg.architecture()]
    table = target_table(g)
    seen, left_out = set(), 0
    for name, ref in ckpt.items():
        if name.startswith(_MULTIMODAL):
            left_out += 1
            continue
        key = _hf_key(name, prefix)
        expected = table.get(key) if key is not None else None
        if expected is None:
            raise ConversionError(f"{ref.describe()}: unexpected tensor for the Gemma-4 config "
                                  f"{text.where} (no GGUF name)")
        if ref.shape != expected.shape:
            raise ConversionError(f"{ref.describe()}: expected shape {list(expected.shape)} from "
                                  f"{text.where}")
        plan.add(_planned(ref, expected.gguf_name, out))
        seen.add(key)
    missing = [prefix + k for k, e in table.items() if e.required and k not in seen]
    if missing:
        raise ConversionError(f"{text.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")
    _check_tied_head(ckpt, g, prefix, text.where)
    if left_out:
        plan.notes.append(f"{left_out} vision/audio tensor(s) left out (text model only)")
    return plan, g
