"""Stop strings on streamed text: cut at the first stop, hold back what could still become one."""
from __future__ import annotations

from typing import Sequence


class StopStringMatcher:
    """Finds stop strings in text that arrives piece by piece.

    :meth:`feed` returns the text that is safe to show: everything before a stop string, minus a
    tail that is the beginning of some stop string (it is held back until the next piece shows
    whether the stop completes). So a stop string split across pieces is still caught, and the
    shown text never contains one.

    Args:
        stops: the stop strings (empty ones are ignored).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add a piece; return the text now safe to show. After a stop, sets ``stopped``."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        cut = self._first_stop(buf)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._partial_stop_len(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text (it did not become a stop string): call when generation ends."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_stop(self, buf: str) -> int | None:
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest tail of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
