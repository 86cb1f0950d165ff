"""The prompt cache: a finished sequence leaves its KV cells with its slot, and a new sequence takes
the free slot holding the longest prefix of its prompt (or shares that prefix's cells with a spare
slot), so the engine prefills only the rest.

Which cells match is the C engine's answer (``Engine.cached_prefix``): every cell records its
token, in the draft's cache too, so a stale cell never counts, whichever engine ran the slot
before. This side only decides where a sequence goes and which cells to give up: when the caches
need room, idle slots lose their cells least recently used first. A cell computed earlier equals a
recomputed one bit for bit, so a hit changes the time to the first token, never the output.

Used from the engine loop thread only.
"""
from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from ..engine import Engine
    from ..kv_cache import KVCache


KV_ALIGN = 64  # DSPARK_KV_ALIGN (dspark-kv-cache.h): a sequence's cells come in blocks of this many positions


class PromptCache:
    """The idle slots' cells, and the choice of a slot for each new sequence.

    Args:
        caches: the KV caches the engines write (the target's, and the draft's if any).
        n_cells: cells in each of them (the context size).
        enabled: False (``--no-cache-prompt``): sequences free their cells when they leave and
            always prefill their whole prompt.
    """

    def __init__(self, caches: Sequence[KVCache], n_cells: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self._caches = list(caches)
        self._n_cells = n_cells
        self._idle: dict[int, int] = {}  # slot whose cells stay -> when its last sequence left
        self._clock = count()

    def choose(self, engine: Engine, prompt: Sequence[int], free: Iterable[int], reuse: bool) -> tuple[int, int]:
        """The free slot for a sequence, and how many of its prompt tokens that slot holds.

        The slot holding the longest prefix of the prompt, when the prompt keeps at least half of
        its cells (a repeat, a chat's next turn). When it keeps less (another conversation on the
        same system prompt), the prefix's cells are shared with a spare slot (no data copied) and
        the sequence runs there, leaving the rest of the other slot's cache alone. With no hit: a
        spare slot, one without cells or else the least recently used. ``reuse`` False (the
        request declined): a spare slot, nothing counts as cached.
        """
        slots = sorted(free)
        if not (self.enabled and reuse):
            return self._spare(slots), 0
        hits = {s: engine.cached_prefix(s, prompt) for s in slots}
        held = {s: self._held(s) for s in slots}
        best = max(slots, key=lambda s: (hits[s], -held[s]))  # of equal hits, the one that loses least
        n = hits[best]
        if n == 0:
            return self._spare(slots), 0
        others = [s for s in slots if s != best]
        if 2 * n >= held[best] or not others:
            return best, n
        # whole blocks only: the spare slot's own cells then start a block, as when recomputed
        n -= n % KV_ALIGN
        spare = self._spare(others)
        if n > 0:
            for kv in self._caches:
                kv.seq_rm(spare)
                kv.seq_cp(best, spare, 0, n)
            self._idle.pop(spare, None)
        return spare, n

    def park(self, slot: int) -> None:
        """A sequence left ``slot`` and its cells stay (its most recent use)."""
        self._idle[slot] = next(self._clock)

    def take(self, slot: int) -> None:
        """A sequence runs in ``slot`` now: its cells are its own until it leaves."""
        self._idle.pop(slot, None)

    def make_room(self, n: int, keep: int | None = None) -> None:
        """Free idle slots' cells, least recently used first (never ``keep``'s), until ``n`` cells
        are free in every cache or no idle slot has any left."""
        while self._idle and self.free_cells() < n and self.reclaim(keep):
            pass

    def reclaim(self, keep: int | None = None) -> bool:
        """Free the cells of the least recently used idle slot other than ``keep``; False if there
        is none."""
        candidates = [s for s in self._idle if s != keep]
        if not candidates:
            return False
        slot = min(candidates, key=self._idle.__getitem__)
        for kv in self._caches:
            kv.seq_rm(slot)
        del self._idle[slot]
        return True

    def _spare(self, slots: list[int]) -> int:
        """A slot without cells if there is one, else the least recently used."""
        return min(slots, key=lambda s: (s in self._idle, self._idle.get(s, 0)))

    def _held(self, slot: int) -> int:
        """Cells the slot's sequence left in the target's cache (positions 0 .. n-1)."""
        return self._caches[0].seq_pos_max(slot) + 1 if self._caches else 0

    def free_cells(self) -> int:
        """Cells free in the fullest cache."""
        return min(self._n_cells - kv.n_used for kv in self._caches)

    @property
    def idle_slots(self) -> int:
        """Slots whose cells stay for a later request."""
        return len(self._idle)

    def cells_used(self) -> list[int]:
        """Cells in use in each cache (the target's first): running sequences' and idle slots', then
        what the idle slots hold of the target's (a cell two slots share counts for each)."""
        return [c.n_used for c in self._caches] + [sum(self._held(slot) for slot in self._idle)]
