"""Qwen2 (`Qwen2ForCausalLM`), written as llama.cpp's `qwen2` architecture: the dense decoder
(`dense.py`) with biases on the q, k and v projections."""
from __future__ import annotations

from .dense import DenseDecoder


class Qwen2(DenseDecoder):
    gguf_arch = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM",)
    qkv_bias = True


ARCH = Qwen2()
