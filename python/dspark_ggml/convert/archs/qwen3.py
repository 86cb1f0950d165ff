"""Qwen3 (`Qwen3ForCausalLM`), written as llama.cpp's `qwen3` architecture: the dense decoder
(`dense.py`) with per-head RMSNorms on q and k. Qwen3 layers are also the layers of most
DFlash/DSpark drafts (`model_type` qwen3, the default)."""
from __future__ import annotations

from .dense import DenseDecoder, DenseDraftLayers


class Qwen3(DenseDecoder):
    gguf_arch = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM",)
    qk_norm = True


ARCH = Qwen3()
DRAFT_LAYERS = DenseDraftLayers(ARCH, model_types=("qwen3",))
