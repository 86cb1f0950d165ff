"""dspark-ggml: speculative decoding with DFlash and DSpark draft models on ggml.

The native library is loaded on first use, so pure-Python parts (the converter, the tokenizer)
import without it.
"""
from __future__ import annotations

from ._version import __version__

__all__ = ["__version__"]
