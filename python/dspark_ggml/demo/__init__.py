"""The demo pair shipped with the package: a tiny Qwen3 code model and its DSpark draft.

Trained by ``tools/demo_pair`` on the Python standard library's own source (see its README):

* ``TARGET_PATH``: the target, Qwen3 architecture, ~5.8 M parameters, 4096-token byte-level BPE
  (Qwen2 pre-tokenizer), ChatML chat template, q8_0.
* ``DRAFT_PATH``: its DSpark draft (anchor-first, block size 8, 3 layers, vanilla Markov head of
  rank 64, confidence head), DeepSpec format converted to GGUF, q8_0.
* ``DRAFT_REDUCED_PATH``: the same draft exported in the speculators format with a reduced draft
  vocabulary (2048 tokens + ``d2t``), converted to GGUF, q8_0.
* ``INFO_PATH``: ``pair.json``, how they were trained and what they measured (tau, acceptance).
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["TARGET_PATH", "DRAFT_PATH", "DRAFT_REDUCED_PATH", "INFO_PATH", "DEMO_PROMPT", "info"]


def _path(name: str) -> str:
    return str(resources.files(__name__).joinpath(name))


TARGET_PATH = _path("target.gguf")
DRAFT_PATH = _path("draft-dspark.gguf")
DRAFT_REDUCED_PATH = _path("draft-dspark-reduced.gguf")
INFO_PATH = _path("pair.json")
DEMO_PROMPT = "def fibonacci(n):"


def info() -> dict:
    """Training facts and measured acceptance of the demo pair."""
    with open(INFO_PATH, encoding="utf-8") as f:
        return json.load(f)
