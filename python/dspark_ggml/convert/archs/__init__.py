"""The target architectures the converter writes, one module each, and the registry that finds
them: by a config's `architectures` entry for targets, by `model_type` for a draft's layers.

A module defines `ARCH`, a `base.TargetArch` (its Hugging Face architecture names, its GGUF
architecture, how its checkpoints become keys and tensors, its tokenizer keys), and
`DRAFT_LAYERS`, a `base.DraftLayers`, when drafts are built from its layers. Adding an
architecture: write its module and add it to `_MODULES`.
"""
from __future__ import annotations

from typing import Optional

from ..errors import ConversionError
from ..hf_config import Config
from . import gemma3, gemma4, llama, qwen2, qwen3, qwen3moe
from .base import DraftLayers, TargetArch

_MODULES = (qwen3, qwen2, llama, qwen3moe, gemma3, gemma4)

# Hugging Face `architectures` entry -> the architecture that converts it
TARGETS: dict[str, TargetArch] = {name: m.ARCH for m in _MODULES for name in m.ARCH.hf_architectures}
# draft layer `model_type` -> the architecture whose layers they are
DRAFT_LAYERS: dict[str, DraftLayers] = {
    model_type: m.DRAFT_LAYERS for m in _MODULES if hasattr(m, "DRAFT_LAYERS")
    for model_type in m.DRAFT_LAYERS.model_types}


def target_arch(cfg: Config) -> Optional[TargetArch]:
    """The architecture of a target config; None when it is not a supported target."""
    return TARGETS.get(cfg.architecture())


def draft_layers(backbone: Config) -> DraftLayers:
    """The architecture of a draft's decoder layers, by their `model_type` (default qwen3)."""
    model_type = backbone.str("model_type", None) or "qwen3"
    if model_type not in DRAFT_LAYERS:
        raise ConversionError(f"{backbone.where}: draft layers of model_type {model_type!r} are "
                              f"not supported (supported: {', '.join(DRAFT_LAYERS)})")
    return DRAFT_LAYERS[model_type]
