"""Server-sent events, and noticing that a client went away while its request runs.

Starlette's StreamingResponse only notices a disconnect when a write fails (ASGI 2.4) and a
finished generator may be closed late, so the server runs its own: the body and a watcher of
``http.disconnect`` race, and whichever way the response ends, ``on_close`` runs at once (it
cancels the request's sequences, freeing their slots at the next step).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from starlette.responses import Response

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event carrying a JSON object."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (or the response is complete: the server says so the same way)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Run ``work`` while watching the client: (True, result), or (False, None) if it went away first
    (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    finished = False
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finished = task in done
    finally:
        for t in (watcher, task):
            t.cancel()
        # let both unwind before going on: a generator the work was iterating can only be closed
        # once the task has left it
        await asyncio.gather(watcher, task, return_exceptions=True)
    if finished:
        return True, task.result()  # the work's own exception, if it raised
    return False, None


class EventStreamResponse(Response):
    """A response streaming ``events`` (SSE bytes), ending early if the client disconnects."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        # as StreamingResponse does: no body attribute, hence no Content-Length header
        self.status_code = 200
        self.media_type = "text/event-stream"
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        try:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            await send(start)
            await unless_disconnected(receive, self._send_body(send))
        except OSError:
            pass  # the connection broke while writing
        finally:
            self.on_close()
            await self.events.aclose()  # type: ignore[attr-defined]

    async def _send_body(self, send: Send) -> None:
        async for data in self.events:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
