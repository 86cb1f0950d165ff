"""Streaming detokenization: text out as tokens arrive, never a partial UTF-8 character."""
from __future__ import annotations

import codecs
import numbers
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns token ids into text chunk by chunk.

    `add(ids)` returns the text that is complete so far; bytes of a multi-byte character
    split across tokens are held back until the character is complete. The work per call is
    proportional to the new tokens only. The concatenation of all `add` results and the final
    `flush()` equals `tokenizer.decode(all_ids, special=special)`.

    special (default False): show control tokens (e.g. <|im_end|>) as their text.
    """

    def __init__(self, tokenizer: "Tokenizer", *, special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._special = special
        self.reset()

    def reset(self) -> None:
        """Forget all input, including held-back bytes."""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # A SentencePiece vocabulary with a space prefix drops the first leading space of
        # the text, as decode() does.
        self._strip_first_space = self._tokenizer._strips_leading_space
        self._at_start = True

    def add(self, ids: int | Iterable[int]) -> str:
        """Append token ids (one id or several); return the newly completed text."""
        batch = (int(ids),) if isinstance(ids, (int, numbers.Integral)) else ids  # numpy ints too
        data = self._tokenizer._piece_bytes(batch, self._special)
        return self._emit(self._decoder.decode(data, final=False))

    def flush(self) -> str:
        """Return whatever is held back (an unfinished character becomes U+FFFD) and reset."""
        text = self._emit(self._decoder.decode(b"", final=True))
        self.reset()
        return text

    def _emit(self, text: str) -> str:
        if self._at_start and text:
            self._at_start = False
            if self._strip_first_space and text[0] == " ":
                return text[1:]
        return text
