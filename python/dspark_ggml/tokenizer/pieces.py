"""Bytes of each token when detokenized, following llama.cpp's token_to_piece rules.

normal tokens: their text, with the byte-level mapping undone (gpt2 model) or the
SentencePiece space mark turned back into a space (llama, gemma4); byte tokens <0xXX>: that
byte; control and unknown tokens: their text, shown only when asked for; user-defined
tokens: their text; unused tokens: nothing.
"""
from __future__ import annotations

import re
from typing import Sequence

from .byte_level import char_to_byte_table, token_text_to_bytes
from .vocab import TokenType, Vocab

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class PieceTable:
    """Per-id bytes, in two renderings: with control/unknown tokens shown, and hidden."""

    def __init__(self, vocab: Vocab) -> None:
        normal_ids = [i for i, kind in enumerate(vocab.types) if kind == TokenType.NORMAL]
        normal_texts = [vocab.tokens[i] for i in normal_ids]
        shown: list[bytes] = [b""] * len(vocab.tokens)
        normal_pieces = _byte_level(normal_texts) if vocab.model == "gpt2" else _space_marked(normal_texts)
        for token_id, piece in zip(normal_ids, normal_pieces):
            shown[token_id] = piece
        hidden = list(shown)
        # The other types are few (specials, byte tokens): handled one by one.
        for token_id, kind in enumerate(vocab.types):
            if kind == TokenType.NORMAL:
                continue
            shown[token_id] = _special_piece(vocab.tokens[token_id], kind)
            if kind not in (TokenType.CONTROL, TokenType.UNKNOWN):
                hidden[token_id] = shown[token_id]
        self.shown = shown
        self.hidden = hidden

    def table(self, special: bool) -> list[bytes]:
        """The rendering for `special` (True: control/unknown tokens shown as their text)."""
        return self.shown if special else self.hidden


def _raw(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _byte_level(texts: Sequence[str]) -> list[bytes]:
    # One list comprehension of C-level calls: a Python call per token costs ~0.5 s on 150k tokens.
    table = char_to_byte_table()
    try:
        return [t.translate(table).encode("latin-1") for t in texts]
    except UnicodeEncodeError:  # some token is not byte-level text: per-token path
        return [token_text_to_bytes(t) for t in texts]


def _space_marked(texts: Sequence[str]) -> list[bytes]:
    return [t.replace("\u2581", " ").encode("utf-8", errors="surrogateescape") for t in texts]


def _special_piece(text: str, kind: int) -> bytes:
    if kind == TokenType.BYTE:
        match = _BYTE_TOKEN.fullmatch(text)
        return bytes((int(match.group(1), 16),)) if match else _raw(text)
    if kind in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
        return _raw(text)
    return b""  # unused and unrecognised types render as nothing, as in llama.cpp
