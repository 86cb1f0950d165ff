"""Stopping a generation cleanly: an abort request from any thread, or Ctrl-C in the main thread."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Callable, Iterator


class Interrupt:
    """The stop request the engine reads (through a C-side flag that `link` points at).

    Set by :meth:`request` (thread-safe) or, while :meth:`catching_sigint` is active, by Ctrl-C.
    Ctrl-C only sets the flag: raising KeyboardInterrupt inside the engine's computation (from a C
    callback) could not stop it cleanly; the engine instead stops where its state is consistent
    and the caller raises afterwards.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.by_signal = False
        self._sinks: list[Callable[[bool], None]] = []

    def link(self, sink: Callable[[bool], None]) -> None:
        """Also pass every request (True) and clear (False) to `sink`, e.g. Engine.request_abort."""
        self._sinks.append(sink)

    def request(self, *, by_signal: bool = False) -> None:
        self.by_signal = self.by_signal or by_signal
        self._event.set()
        for sink in self._sinks:
            sink(True)

    def clear(self) -> None:
        self._event.clear()
        self.by_signal = False
        for sink in self._sinks:
            sink(False)

    def is_set(self) -> bool:
        return self._event.is_set()

    @contextmanager
    def catching_sigint(self) -> Iterator[None]:
        """Turn Ctrl-C into a stop request for the duration of the block.

        Only in the main thread (the only one Python delivers signals to) and only when SIGINT has
        Python's default handler: an application's own handler is left alone.
        """
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            yield
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.request(by_signal=True)
