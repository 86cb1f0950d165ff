"""Answering a generation request: wait for its choices (JSON) or stream them (SSE)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator

from ..errors import ContextFullError, InvalidArgumentError
from .errors import ApiError, bad_request, error_body
from .responses import Choice, ResponseBuilder
from .scheduler import Failure
from .sse import DONE, EventStreamResponse, event, unless_disconnected

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from .submission import Submission

Receive = Any


async def respond_whole(submission: Submission, builder: ResponseBuilder, n: int,
                        receive: Receive) -> dict[str, Any] | None:
    """The whole response; None if the client went away first (its sequences are then cancelled)."""
    choices = [Choice(i) for i in range(n)]
    try:
        connected, _ = await unless_disconnected(receive, _collect(submission, choices))
    finally:
        submission.cancel()  # a no-op once every choice finished
    return builder.completion(choices) if connected else None


async def _collect(submission: Submission, choices: list[Choice]) -> None:
    async for ev in submission.events():
        if isinstance(ev, Failure):
            raise failure_error(ev)
        _add(choices[ev.index], ev)


async def respond_stream(submission: Submission, builder: ResponseBuilder, n: int,
                         include_usage: bool) -> EventStreamResponse:
    """An SSE response; the first event is awaited first, so that a request the engine refuses
    (context full, bad speculative setting) still gets an HTTP error status."""
    events = submission.events()
    try:
        first = await events.__anext__()
    except BaseException:
        submission.cancel()
        raise
    if isinstance(first, Failure):
        submission.cancel()
        raise failure_error(first)
    body = _stream(first, events, [Choice(i) for i in range(n)], builder, include_usage)
    return EventStreamResponse(body, submission.cancel)


async def _stream(first: GenerationChunk, events: AsyncIterator[GenerationChunk | Failure],
                  choices: list[Choice], builder: ResponseBuilder,
                  include_usage: bool) -> AsyncIterator[bytes]:
    for data in _chunk_events(first, choices, builder):
        yield data
    async for ev in events:
        if isinstance(ev, Failure):
            err = failure_error(ev)
            yield event(error_body(err.status, err.message))
            break
        for data in _chunk_events(ev, choices, builder):
            yield data
    else:
        if include_usage:
            yield event(builder.usage_chunk(choices))
    yield DONE


def _chunk_events(chunk: GenerationChunk, choices: list[Choice], builder: ResponseBuilder) -> list[bytes]:
    """The SSE events of one engine chunk: a role chunk first (chat), text, then the finish chunk."""
    c = choices[chunk.index]
    first = not c.text  # nothing received for this choice yet
    _add(c, chunk)
    out = []
    if first and builder.chat:
        out.append(event(builder.chunk(c.index, "", first=True)))
    if chunk.text:
        out.append(event(builder.chunk(c.index, chunk.text)))
    if chunk.finish_reason is not None:
        out.append(event(builder.chunk(c.index, "", chunk.finish_reason)))
    return out


def _add(choice: Choice, chunk: GenerationChunk) -> None:
    choice.text.append(chunk.text)
    choice.tokens += chunk.tokens
    if chunk.finish_reason is not None:
        choice.finish_reason, choice.stats = chunk.finish_reason, chunk.stats


def failure_error(f: Failure) -> ApiError:
    """The HTTP error for a sequence the engine refused: the caller's fault (400) or ours (500)."""
    if isinstance(f.error, ContextFullError):
        return bad_request(f"no room in the context for this request: {f.error}", "prompt")
    if isinstance(f.error, InvalidArgumentError):
        return bad_request(str(f.error))
    return ApiError(500, f"generation failed: {f.error}")
