"""KV cache sequence operations (bookkeeping only: no graph runs)."""
from __future__ import annotations

from typing import Any

from . import _lib
from .errors import InvalidArgumentError


class KVCache:
    """The KV cache of a target or draft context; owned by that context.

    Positions are per sequence; ``p1 < 0`` means "to the end".
    """

    def __init__(self, handle: Any, n_seq_max: int, owner: Any) -> None:
        self._handle = handle
        self._owner = owner  # keeps the context (and so the cache) alive
        self.n_seq_max = n_seq_max

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence (seq_id -1: of every sequence)."""
        _lib.check(_lib.lib().dspark_kv_seq_rm(self._handle, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Share positions [p0, p1) of ``src`` with ``dst`` (the cells are shared, not copied)."""
        _lib.check(_lib.lib().dspark_kv_seq_cp(self._handle, src, dst, p0, p1))

    def seq_keep(self, seq_id: int) -> None:
        """Remove every other sequence."""
        _lib.check(_lib.lib().dspark_kv_seq_keep(self._handle, seq_id))

    def clear(self) -> None:
        _lib.lib().dspark_kv_clear(self._handle)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest cached position of a sequence, -1 if it has none."""
        self._check(seq_id)
        return int(_lib.lib().dspark_kv_seq_pos_max(self._handle, seq_id))

    def seq_pos_min(self, seq_id: int) -> int:
        self._check(seq_id)
        return int(_lib.lib().dspark_kv_seq_pos_min(self._handle, seq_id))

    @property
    def n_used(self) -> int:
        """Cells in use (shared cells count once)."""
        return int(_lib.lib().dspark_kv_n_used(self._handle))

    @property
    def n_cells(self) -> int:
        """Cells the cache holds (a cell: one position's K and V in every layer)."""
        return int(_lib.lib().dspark_kv_n_cells(self._handle))

    @property
    def nbytes(self) -> int:
        """Bytes of K and V allocated over every layer."""
        return int(_lib.lib().dspark_kv_nbytes(self._handle))

    def _check(self, seq_id: int) -> None:
        if not 0 <= seq_id < self.n_seq_max:
            raise InvalidArgumentError(f"sequence id {seq_id} out of range (0 .. {self.n_seq_max - 1})")
