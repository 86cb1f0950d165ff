"""Tokenizer built from a GGUF file's `tokenizer.*` metadata, in pure Python over `tokenizers`."""
from __future__ import annotations

from .errors import ChatTemplateError, TokenizerError
from .gguf_metadata import read_gguf_metadata
from .pretokenizers import PRE_TOKENIZERS
from .streaming import IncrementalDetokenizer
from .tokenizer import Tokenizer
from .vocab import TokenType

__all__ = [
    "ChatTemplateError", "IncrementalDetokenizer", "PRE_TOKENIZERS", "Tokenizer", "TokenizerError",
    "TokenType", "read_gguf_metadata",
]
