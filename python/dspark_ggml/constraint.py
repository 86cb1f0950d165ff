"""A token constraint (a grammar engine) as the C engine calls it: struct dspark_constraint.

Any object with ``fill_masks(tokens, out) -> int`` and ``commit(tokens)`` works (see
``structured.TokenConstraint``): ``out`` is a uint32 array [len(tokens) + 1, n_words] of the
target's vocabulary, bit t % 32 of word t // 32 set = token t allowed; ``fill_masks`` fills row 0
(the state after the committed tokens) and row i + 1 only while row i allows tokens[i], and
returns the rows it filled. The engine calls them once per step for the sequence; an exception
in them fails that step (or the add) with an error naming it, it never crashes the process.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from . import _lib

logger = logging.getLogger("dspark_ggml")


class ConstraintBinding:
    """The cffi callbacks and the C struct of one constraint object, kept alive together while the
    engine may call them; ``error`` holds the last exception a callback raised."""

    def __init__(self, constraint: Any) -> None:
        ffi = _lib.ffi()
        self.constraint = constraint
        self.error: BaseException | None = None
        self._masks = ffi.callback("int32_t(void *, const int32_t *, int32_t, uint32_t *, int32_t)",
                                   self._fill, onerror=self._on_error, error=-1)
        self._commit = ffi.callback("int32_t(void *, const int32_t *, int32_t)",
                                    self._commit_tokens, onerror=self._on_error, error=-1)
        self.c = ffi.new("struct dspark_constraint *")
        self.c.masks, self.c.commit, self.c.user_data = self._masks, self._commit, ffi.NULL

    def _on_error(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.error = exc if exc is not None else exc_type()
        logger.debug("constraint callback failed: %r", self.error)

    def _fill(self, _ud: Any, tokens: Any, n: int, masks: Any, n_words: int) -> int:
        ffi = _lib.ffi()
        toks = list(ffi.unpack(tokens, n)) if n else []
        out = np.frombuffer(ffi.buffer(masks, 4 * (n + 1) * n_words), dtype=np.uint32).reshape(n + 1, n_words)
        rows = int(self.constraint.fill_masks(toks, out))
        if not 1 <= rows <= n + 1:
            raise ValueError(f"fill_masks returned {rows} rows for {n} tokens (must be 1..{n + 1})")
        return rows

    def _commit_tokens(self, _ud: Any, tokens: Any, n: int) -> int:
        self.constraint.commit(list(_lib.ffi().unpack(tokens, n)))
        return 0

    def take_error(self) -> BaseException | None:
        e, self.error = self.error, None
        return e
