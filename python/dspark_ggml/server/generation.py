"""Answering a generation request: wait for its choices (JSON) or stream them (SSE).

A stream's events come from a :class:`StreamFormat`: chat / completion chunks
(:class:`CompletionStream`), or the Responses API's events (``responses_api.ResponseStream``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Protocol

from ..errors import ConstraintError, ContextFullError, InvalidArgumentError
from .engines import TooManySettingsError
from .errors import ApiError, bad_request, error_body, unavailable
from .logprobs import chunk_logprobs
from .responses import Choice, ResponseBuilder, text_before_calls, text_held_back
from .scheduler import Failure
from .sse import DONE, EventStreamResponse, event, unless_disconnected

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from .submission import Submission

Receive = Any


class StreamFormat(Protocol):
    """The SSE events of one streamed request."""

    def opening(self) -> list[bytes]:
        """Events before the first chunk."""

    def on_chunk(self, chunk: GenerationChunk, choice: Choice, first: bool) -> list[bytes]:
        """Events of one engine chunk (``choice`` has it added already; ``first``: its first)."""

    def closing(self, choices: list[Choice]) -> list[bytes]:
        """Events after every choice finished."""

    def on_failure(self, error: ApiError, choices: list[Choice]) -> list[bytes]:
        """Events when the engine failed a sequence mid-stream (the stream ends after them)."""


async def respond_whole(submission: Submission, n: int, receive: Receive) -> list[Choice] | None:
    """Every choice, finished; None if the client went away first (its sequences are then cancelled)."""
    choices = [Choice(i) for i in range(n)]
    try:
        connected, _ = await unless_disconnected(receive, _collect(submission, choices))
    finally:
        submission.cancel()  # a no-op once every choice finished
    return choices if connected else None


async def _collect(submission: Submission, choices: list[Choice]) -> None:
    async for ev in submission.events():
        if isinstance(ev, Failure):
            raise failure_error(ev)
        _add(choices[ev.index], ev)


async def respond_stream(submission: Submission, fmt: StreamFormat, n: int) -> EventStreamResponse:
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
    body = _stream(first, events, [Choice(i) for i in range(n)], fmt)
    return EventStreamResponse(body, submission.cancel)


async def _stream(first: GenerationChunk, events: AsyncIterator[GenerationChunk | Failure],
                  choices: list[Choice], fmt: StreamFormat) -> AsyncIterator[bytes]:
    for data in fmt.opening():
        yield data
    for data in _on_chunk(fmt, first, choices):
        yield data
    async for ev in events:
        if isinstance(ev, Failure):
            for data in fmt.on_failure(failure_error(ev), choices):
                yield data
            return
        for data in _on_chunk(fmt, ev, choices):
            yield data
    for data in fmt.closing(choices):
        yield data


def _on_chunk(fmt: StreamFormat, chunk: GenerationChunk, choices: list[Choice]) -> list[bytes]:
    c = choices[chunk.index]
    first = not c.text  # nothing received for this choice yet
    _add(c, chunk)
    return fmt.on_chunk(chunk, c, first)


class CompletionStream:
    """Chat / completion chunks: a role chunk first (chat), text, the finish chunk; then the usage
    chunk when the request asked for it, and [DONE]."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder

    def opening(self) -> list[bytes]:
        return []

    def on_chunk(self, chunk: GenerationChunk, choice: Choice, first: bool) -> list[bytes]:
        b = self.builder
        out = []
        if first and b.chat:
            out.append(event(b.chunk(choice.index, "", first=True)))
        text = b.echo_text(choice.index) + chunk.text if first and not b.chat else chunk.text
        logprobs = self._logprobs(chunk, choice, text)
        if b.extras.tools is not None:
            text = text_before_calls(choice)
        if text or logprobs is not None:
            out.append(event(b.chunk(choice.index, text, logprobs=logprobs)))
        if chunk.finish_reason is not None:
            out += self._last(choice)
        return out

    def _logprobs(self, chunk: GenerationChunk, choice: Choice, text: str) -> dict[str, Any] | None:
        """The logprobs object of a chunk's tokens (None: not asked for, or no tokens)."""
        b = self.builder
        entries = chunk_logprobs(chunk)
        offset, choice.n_chars = choice.n_chars, choice.n_chars + len(text)
        if not entries:
            return None
        return b.chat_logprobs(entries) if b.chat else b.completion_chunk_logprobs(choice, entries, offset)

    def _last(self, choice: Choice) -> list[bytes]:
        """The finish chunk; with tools, first the text held back, then the tool calls."""
        b = self.builder
        out = []
        calls = None
        if b.extras.tools is not None:
            calls = b.tool_calls(choice)
            content = text_held_back(choice, calls)
            if content:
                out.append(event(b.chunk(choice.index, content)))
        out.append(event(b.finish_chunk(choice, tool_calls=calls.calls if calls is not None else None)))
        return out

    def closing(self, choices: list[Choice]) -> list[bytes]:
        usage = [event(self.builder.usage_chunk(choices))] if self.builder.include_usage else []
        return [*usage, DONE]

    def on_failure(self, error: ApiError, choices: list[Choice]) -> list[bytes]:
        return [event(error_body(error.status, error.message)), DONE]


def _add(choice: Choice, chunk: GenerationChunk) -> None:
    choice.text.append(chunk.text)
    choice.tokens += chunk.tokens
    choice.logprobs += chunk_logprobs(chunk)
    prompt_logprobs = getattr(chunk, "prompt_logprobs", None)
    if prompt_logprobs:
        choice.prompt_logprobs = prompt_logprobs[1:]  # the first prompt token has none (echo: NoLogprob)
    if chunk.finish_reason is not None:
        choice.finish_reason, choice.stats = chunk.finish_reason, chunk.stats


def failure_error(f: Failure) -> ApiError:
    """The HTTP error for a sequence the engine refused: the caller's fault (400), a setting that
    must wait (503), or ours (500)."""
    if isinstance(f.error, ContextFullError):
        return bad_request(f"no room in the context for this request: {f.error}", "prompt")
    if isinstance(f.error, TooManySettingsError):
        return unavailable(str(f.error))
    if isinstance(f.error, InvalidArgumentError):
        return bad_request(str(f.error))
    if isinstance(f.error, ConstraintError):  # the request's grammar gave up (e.g. past its limits)
        return bad_request(f"structured output failed: {f.error.__cause__ or f.error}")
    return ApiError(500, f"generation failed: {f.error}")
