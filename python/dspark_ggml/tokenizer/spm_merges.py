"""Merge ranks for a SentencePiece-style vocabulary that has scores but no merge list.

SentencePiece BPE (and llama.cpp's "llama" tokenizer) repeatedly joins the adjacent pair of
pieces whose concatenation is the highest-scoring vocabulary entry. A rank-based BPE gives
the same result when every way of splitting a normal token into two normal tokens is a
merge, ranked by the joined token's score (higher first).
"""
from __future__ import annotations

from typing import Sequence

from .vocab import TokenType


def merges_from_scores(tokens: Sequence[str], types: Sequence[int],
                       scores: Sequence[float] | None) -> list[tuple[str, str]]:
    """Merges in rank order. Without scores, lower ids rank first.

    Ties in score are broken by token id, then by split position: equal scores are rare in
    real vocabularies, and llama.cpp breaks them by text position instead, which a rank
    list cannot express.
    """
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TokenType.NORMAL}
    ranked: list[tuple[float, int, int, str, str]] = []
    for text, token_id in normal.items():
        if len(text) < 2:
            continue
        score = scores[token_id] if scores is not None else -float(token_id)
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in normal and right in normal:
                ranked.append((-score, token_id, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]
