"""The tokenizer's view of a GGUF's metadata: the key/value pairs read by the core's GGUF reader
(gguf_file.GGUFFile, the one reader of the package), arrays as Python lists.

Only the keys asked for are decoded (the tokenizer asks for "tokenizer."): a 150k-token
vocabulary reads in a fraction of a second. Tensor data is never touched.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import DSparkError
from ..gguf_file import GGUFFile, decode_gguf_string
from .errors import TokenizerError

__all__ = ["decode_gguf_string", "read_gguf_metadata"]


def read_gguf_metadata(path: str | os.PathLike[str], prefix: str = "") -> dict[str, Any]:
    """Read the key/value metadata of the GGUF file at `path` (keys filtered by `prefix`).

    Raises TokenizerError naming the file when it is not a GGUF the core can read (bad magic,
    truncated, big-endian, a version it does not know)."""
    try:
        with GGUFFile(path) as f:
            meta = f.read_metadata(prefix)
    except DSparkError as exc:
        raise TokenizerError(str(exc)) from exc
    return {key: _as_list(value) for key, value in meta.items()}


def _as_list(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value
