"""Token logprobs in OpenAI's two shapes: chat's ``logprobs.content`` entries and the completions
API's parallel lists (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``).

The values are the engine's (``TokenLogprob``: the token, its logprob, the top entries of the same
distribution); here they only get their text. A token's text is its piece (bytes) decoded as UTF-8,
a piece that is part of a character shown with U+FFFD; ``bytes`` has the exact bytes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from ..tokenizer import Tokenizer


class LogprobText:
    """Turns token ids into their text and bytes (memoised: a response repeats tokens)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}

    def piece(self, token: int) -> bytes:
        b = self._cache.get(token)
        if b is None:
            b = self._tokenizer.token_to_piece(token, special=True) if self._tokenizer is not None else b""
            self._cache[token] = b
        return b

    def text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", errors="replace")


def _value(lp: float) -> float:
    """A logprob as JSON can carry it: -inf (a token the filters removed) as a very small number."""
    return lp if lp > -1e30 else -9999.0


def chat_entries(entries: Sequence[Any], text: LogprobText) -> list[dict[str, Any]]:
    """``choices[i].logprobs.content`` entries of these tokens."""
    return [{"token": text.text(e.token), "logprob": _value(e.logprob), "bytes": list(text.piece(e.token)),
             "top_logprobs": [{"token": text.text(t), "logprob": _value(lp), "bytes": list(text.piece(t))}
                              for t, lp in e.top]} for e in entries]


def completion_logprobs(entries: Sequence[Any | None], text: LogprobText, offset: int = 0) -> dict[str, Any]:
    """The completions API's logprobs object of these tokens; ``offset``: where the first token's
    text starts in the choice's text (a streamed chunk's tokens follow the earlier ones). An entry
    None is a token without a logprob (the prompt's first, with echo)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for e in entries:
        s = text.text(e.token)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
        if e.logprob is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(_value(e.logprob))
        top: dict[str, float] = {}
        for t, lp in e.top:
            top.setdefault(text.text(t), _value(lp))  # two tokens may share a text: the likelier one
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


class NoLogprob:
    """A token without a logprob (the prompt's first token, echoed)."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.logprob = None
        self.top: list[tuple[int, float]] = []


def chunk_logprobs(chunk: GenerationChunk) -> list[Any]:
    """The logprobs of a chunk's text tokens ([] when the request did not ask for them): as in
    OpenAI's API, the end-of-generation / stop token that ended the sequence has none."""
    entries = list(getattr(chunk, "logprobs", None) or [])
    return entries[:-1] if entries and getattr(chunk, "ended_by_token", False) else entries
