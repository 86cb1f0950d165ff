"""The tiny pair the tests run on: a 5.8 M-parameter Qwen3 code model and its DSpark draft.

Trained by ``tools/demo_pair`` on the Python standard library's own source (see its README); it was
the package's demo before the real one (SmolLM2-135M-Instruct and its trained draft,
``dspark_ggml.demo``). Its text is nonsense, but it decodes at thousands of tokens per second, its
draft's acceptance is real (tau about 6 greedy), and every path of the runtime runs on it.

* ``TARGET_PATH``: Qwen3 architecture, 4096-token byte-level BPE (Qwen2 pre-tokenizer), ChatML
  chat template, q8_0.
* ``DRAFT_PATH``: its DSpark draft (anchor-first, block size 8, 3 layers, vanilla Markov head of
  rank 64, confidence head), DeepSpec format converted to GGUF, q8_0.
* ``DRAFT_REDUCED_PATH``: the same draft in the speculators format with a reduced vocabulary (2048
  tokens + ``d2t``), q8_0.
* ``INFO_PATH``: ``pair.json``, how they were trained and what they measured.
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "data" / "tiny_pair"
TARGET_PATH = str(HERE / "target.gguf")
DRAFT_PATH = str(HERE / "draft-dspark.gguf")
DRAFT_REDUCED_PATH = str(HERE / "draft-dspark-reduced.gguf")
INFO_PATH = str(HERE / "pair.json")
PROMPT = "def fibonacci(n):\n"  # the model completes Python source: lines it continues end with a newline


def info() -> dict:
    """Training facts and measured acceptance of the tiny pair."""
    with open(INFO_PATH, encoding="utf-8") as f:
        return json.load(f)
