"""One HTTP request's sequences in the scheduler, seen from the asyncio side.

The engine thread hands each event (a chunk or a Failure) to the event loop with
call_soon_threadsafe; the request's coroutine reads them from an asyncio queue. Cancelling (client
gone, server draining past its timeout) tells the scheduler to drop the sequences at the next step.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

from ..results import GenerationChunk
from .scheduler import Failure, Job

if TYPE_CHECKING:
    from ..decode_loop import Request
    from .engines import SpecOverride
    from .scheduler import Scheduler



class Submission:
    """Submits a request's choices (all or none: QueueFullError) and yields their events."""

    def __init__(self, scheduler: Scheduler, requests: list[Request],
                 speculative: SpecOverride | None, cache_prompt: bool = True) -> None:
        self._scheduler = scheduler
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[GenerationChunk | Failure] = asyncio.Queue()
        self.jobs = [Job(r, speculative, self._deliver, cache_prompt) for r in requests]
        self._open = len(self.jobs)  # choices that have not sent their last event
        scheduler.submit(self.jobs)

    def _deliver(self, event: object) -> None:
        """Engine thread: pass the event to the loop (dropped if the loop has closed)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:
            pass

    async def events(self) -> AsyncIterator[GenerationChunk | Failure]:
        """Every event, until each choice has sent its last one."""
        while self._open:
            event = await self._queue.get()
            if isinstance(event, Failure) or event.finish_reason is not None:
                self._open -= 1
            yield event

    @property
    def finished(self) -> bool:
        return self._open == 0

    def cancel(self) -> None:
        """Drop the choices still running or waiting (idempotent; finished ones are unaffected)."""
        if self._open:
            for job in self.jobs:
                self._scheduler.cancel(job)
