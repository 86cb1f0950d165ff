"""Llama-style dense decoders (Qwen3, Qwen2, Llama), written as llama.cpp writes them: same keys,
tensor names, layouts and types as llama.cpp's converter. `DenseDecoder` holds what they share;
each architecture's module (`qwen3.py`, `qwen2.py`, `llama.py`) says what its layers add."""
from __future__ import annotations

from typing import Optional

import numpy as np
from gguf import GGMLQuantizationType

from ..backbone import Backbone, read_backbone, write_backbone_kv
from ..errors import ConversionError
from ..hf_config import Config
from ..metadata import KeyValues
from ..plan import ArrayTensor, ModelPlan, PlannedTensor, StoredTensor
from ..quant import OutType, tensor_type
from ..safetensors_io import Checkpoint, TensorRef, tensors_equal
from ..tensor_names import ROPE_FREQS, layer_tensor_name, layer_tensor_shapes
from .base import DraftBackbone, DraftLayers, TargetArch

# HF name -> GGUF name of the tensors outside the decoder layers
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


class DenseDecoder(TargetArch):
    qk_norm: bool = False  # per-head q/k RMSNorm (Qwen3)
    qkv_bias: bool = False  # q/k/v projection biases always present (Qwen2)

    # ------------------------------------------------------------------------------------------
    # what an architecture may change

    def check_rope(self, cfg: Config, bb: Backbone) -> None:
        if bb.rope.kind == "llama3":
            raise ConversionError(f"{cfg.where}: llama3 rope scaling on a {self.gguf_arch} model "
                                  "cannot be expressed in GGUF")

    def layer_shapes(self, cfg: Config, bb: Backbone) -> dict[str, tuple[int, ...]]:
        return layer_tensor_shapes(bb, qk_norm=self.qk_norm, qkv_bias=self.qkv_bias)

    def source(self, ref: TensorRef, part: Optional[str], bb: Backbone):
        """How a stored tensor is written (`part`: its name inside the layer, None if global)."""
        return StoredTensor(ref)

    def extra_kv(self, bb: Backbone, kv: KeyValues) -> None:
        """Keys beyond the backbone's."""

    def rope_freqs(self, bb: Backbone) -> Optional[np.ndarray]:
        """The `rope_freqs.weight` tensor, when the rope scaling needs one."""
        return None

    # ------------------------------------------------------------------------------------------

    def plan_target(self, ckpt: Checkpoint, cfg: Config, out: OutType) -> tuple[ModelPlan, int]:
        bb = read_backbone(cfg)
        self._check_supported(cfg, bb)
        kv = KeyValues(self.gguf_arch)
        write_backbone_kv(bb, kv)
        self.extra_kv(bb, kv)
        plan = ModelPlan(self.gguf_arch, kv)
        self._plan_tensors(plan, ckpt, cfg, bb, out)
        return plan, bb.vocab_size

    # validation of what the GGUF architectures cannot express
    def _check_supported(self, cfg: Config, bb: Backbone) -> None:
        layer_types = cfg.str_list("layer_types", [])
        if cfg.bool("use_sliding_window", False) or "sliding_attention" in layer_types:
            raise ConversionError(f"{cfg.where}: sliding-window attention is not supported for "
                                  f"{self.gguf_arch} targets (llama.cpp would run it as full attention)")
        self.check_rope(cfg, bb)
        if bb.partial_rotary_factor not in (None, 1.0):
            raise ConversionError(f"{cfg.where}: partial_rotary_factor {bb.partial_rotary_factor} is "
                                  f"not supported for {self.gguf_arch} targets")
        for key in ("num_experts", "num_local_experts"):
            if cfg.int(key, 0):
                raise ConversionError(f"{cfg.where}: mixture-of-experts models are not supported")

    def _plan_tensors(self, plan: ModelPlan, ckpt: Checkpoint, cfg: Config, bb: Backbone,
                      out: OutType) -> None:
        layer_shapes = self.layer_shapes(cfg, bb)
        global_shapes = {"token_embd.weight": (bb.vocab_size, bb.n_embd),
                         "output_norm.weight": (bb.n_embd,),
                         "output.weight": (bb.vocab_size, bb.n_embd)}
        freqs = self.rope_freqs(bb)
        if freqs is not None:
            plan.add(PlannedTensor(ROPE_FREQS, ArrayTensor(freqs), GGMLQuantizationType.F32))
        for hf_name, ref in ckpt.items():
            if hf_name.endswith(".rotary_emb.inv_freq"):
                continue  # recomputed by the runtime
            name, part = _gguf_name(hf_name, bb)
            expected = global_shapes[name] if part is None else layer_shapes.get(part)
            if expected is None or ref.shape != expected:
                raise ConversionError(f"{ref.describe()}: expected shape "
                                      f"{list(expected) if expected else 'none (unexpected tensor)'} "
                                      f"from {cfg.where}")
            if ref.dtype not in ("F32", "F16", "BF16", "F64"):
                raise ConversionError(f"{ref.describe()}: not a floating-point tensor")
            plan.add(PlannedTensor(name, self.source(ref, part, bb),
                                   tensor_type(name, ref.shape, out)))
        _check_complete(plan, cfg, bb, layer_shapes)
        _check_tied_head(ckpt, cfg, bb)


def _gguf_name(hf_name: str, bb: Backbone) -> tuple[str, Optional[str]]:
    """(GGUF name, key into the per-layer shape table or None for a global tensor)."""
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name], None
    layer = layer_tensor_name(hf_name.removeprefix("model.")) if hf_name.startswith("model.") \
        else None
    if layer is None or layer[0] >= bb.n_layer:
        raise ConversionError(f"unexpected tensor {hf_name!r} in the checkpoint (no GGUF name)")
    return layer[2], layer[1]


def _check_complete(plan: ModelPlan, cfg: Config, bb: Backbone,
                    layer_shapes: dict[str, tuple[int, ...]]) -> None:
    have = {t.name for t in plan.tensors}
    required = {"token_embd.weight", "output_norm.weight"}
    for i in range(bb.n_layer):
        for part in layer_shapes:
            required.add(layer_tensor_name(f"layers.{i}.{part}")[2])
    missing = sorted(required - have)
    if missing:
        raise ConversionError(f"{cfg.where}: the checkpoint lacks {len(missing)} tensor(s) the "
                              f"config implies, e.g. {missing[:3]}")
    if "output.weight" not in have and not bb.tie_word_embeddings:
        raise ConversionError(f"{cfg.where}: tie_word_embeddings is false but the checkpoint has "
                              "no lm_head.weight")


def _check_tied_head(ckpt: Checkpoint, cfg: Config, bb: Backbone) -> None:
    """A tied model that still stores an lm_head: Hugging Face uses the embedding, llama.cpp
    would use the stored head. Harmless when they are equal; refused when they are not."""
    head = ckpt.get("lm_head.weight")
    if bb.tie_word_embeddings and head is not None and not tensors_equal(
            head, ckpt["model.embed_tokens.weight"]):
        raise ConversionError(f"{cfg.where}: tie_word_embeddings is true but lm_head.weight "
                              "differs from the embedding; fix tie_word_embeddings in the config")


class DenseDraftLayers(DraftLayers):
    """Draft layers of a dense decoder: the generic keys, every layer alike."""

    def __init__(self, arch: DenseDecoder, model_types: tuple[str, ...]):
        self.arch = arch
        self.name = arch.gguf_arch
        self.model_types = model_types

    def read(self, backbone: Config) -> DraftBackbone:
        bb = read_backbone(backbone)
        table = {}
        for i in range(bb.n_layer):
            for part, shape in self.arch.layer_shapes(backbone, bb).items():
                table[f"layers.{i}.{part}"] = (layer_tensor_name(f"layers.{i}.{part}")[2], shape)
        return DraftBackbone(bb, table, write_kv=lambda kv: None)
