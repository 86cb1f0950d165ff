"""OpenAI's Responses API (/v1/responses): the response object and its stream.

The request runs as a chat completion of one choice (``protocol.parse_responses`` translates it).
Its output is a message item with one output_text part (with the tokens' logprobs when asked for),
and, when the request had tools and the model called them, a function_call item per call (after
the message, which is left out when the model wrote no text around the calls). A stream sends
OpenAI's events, each as ``event: <type>`` plus its JSON with ``type`` and ``sequence_number``:
response.created, response.in_progress; for the message response.output_item.added,
response.content_part.added, response.output_text.delta per piece of text, response.output_text.done,
response.content_part.done, response.output_item.done; for each call response.output_item.added,
response.function_call_arguments.delta and .done, response.output_item.done; then
response.completed (response.incomplete when max_output_tokens cut it short). With tools the message
opens with its first text, and text that may be the start of a call is held back until it is known
not to be. An engine failure mid-stream sends error and response.failed.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from .logprobs import chat_entries, chunk_logprobs
from .responses import Choice, speculative_stats, text_before_calls, text_held_back

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from .errors import ApiError
    from .responses import ResponseBuilder


class ResponseObject:
    """Builds the response objects of one request (same ids and creation time in each)."""

    def __init__(self, builder: ResponseBuilder, echo: dict[str, Any]) -> None:
        self.b = builder
        self.id = "resp_" + uuid.uuid4().hex
        self.message_id = "msg_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.echo = echo
        self._calls: list[dict[str, Any]] | None = None  # the output's function_call items, once parsed

    def response(self, status: str, choice: Choice | None = None) -> dict[str, Any]:
        """The response object; with ``choice`` (finished) its output, usage and status."""
        incomplete = None
        output: list[dict[str, Any]] = []
        usage = None
        spec = speculative_stats(self.b.method, [])
        if choice is not None:
            item_status = "completed" if status == "completed" else "incomplete"
            text = self.b.answer_text(choice)
            calls = self.calls(choice)
            output = ([self.message(text, self.logprobs(choice), item_status)] if text or not calls else []) + calls
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            n_out = len(choice.tokens)
            usage = {"input_tokens": self.b.n_prompt,
                     "input_tokens_details": {"cached_tokens": choice.stats.n_cached if choice.stats else 0},
                     "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": self.b.n_prompt + n_out}
            spec = speculative_stats(self.b.method, [choice.stats] if choice.stats else [])
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": incomplete, "model": self.b.model, "output": output,
                "reasoning": None, "previous_response_id": None, "usage": usage, "speculative": spec,
                **self.echo}

    def calls(self, choice: Choice) -> list[dict[str, Any]]:
        """The function_call items of the answer (parsed once: their ids stay the same)."""
        if self._calls is None:
            parsed = self.b.tool_calls(choice)
            self._calls = [{"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call["id"],
                            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                            "status": "completed"} for call in (parsed.calls if parsed is not None else [])]
        return self._calls

    def logprobs(self, choice: Choice) -> list[dict[str, Any]]:
        return self.chunk_logprobs(choice.logprobs)

    def chunk_logprobs(self, entries: list[Any]) -> list[dict[str, Any]]:
        """Tokens' logprobs as an output_text part lists them (the chat entries' shape)."""
        return chat_entries(entries, self.b.extras.text) if self.b.extras.logprobs and entries else []

    def message(self, text: str | None, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
        content = [] if text is None else [self.text_part(text, logprobs)]
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant",
                "content": content}

    @staticmethod
    def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    @staticmethod
    def status_of(choice: Choice) -> str:
        return "incomplete" if choice.finish_reason in ("length", "context_full") else "completed"

    def whole(self, choice: Choice) -> dict[str, Any]:
        return self.response(self.status_of(choice), choice)


class ResponseStream:
    """The Responses API's stream events (a :class:`generation.StreamFormat`)."""

    def __init__(self, obj: ResponseObject) -> None:
        self.obj = obj
        self._seq = 0
        self._message_open = False
        self._tools = obj.b.extras.tools is not None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return (f"event: {kind}\ndata: ".encode() +
                json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.obj.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> list[bytes]:
        o = self.obj
        out = [self._event("response.created", response=o.response("in_progress")),
               self._event("response.in_progress", response=o.response("in_progress"))]
        return out if self._tools else out + self._open_message()

    def _open_message(self) -> list[bytes]:
        self._message_open = True
        return [self._event("response.output_item.added", output_index=0,
                            item=self.obj.message(None, [], "in_progress")),
                self._event("response.content_part.added", **self._at(), part=self.obj.text_part(""))]

    def _delta(self, text: str, logprobs: list[dict[str, Any]]) -> list[bytes]:
        if not text:
            return []
        out = [] if self._message_open else self._open_message()
        return out + [self._event("response.output_text.delta", **self._at(), delta=text, logprobs=logprobs)]

    def on_chunk(self, chunk: GenerationChunk, choice: Choice, first: bool) -> list[bytes]:
        if not self._tools:
            return self._delta(chunk.text, self.obj.chunk_logprobs(chunk_logprobs(chunk)))
        text = text_before_calls(choice)
        return self._delta(text, [])

    def closing(self, choices: list[Choice]) -> list[bytes]:
        o, choice = self.obj, choices[0]
        status = o.status_of(choice)
        item_status = "completed" if status == "completed" else "incomplete"
        calls = o.calls(choice)
        text = o.b.answer_text(choice)
        out = []
        if self._tools:
            out += self._delta(text_held_back(choice, o.b.tool_calls(choice)), [])
        if self._message_open or not calls:
            if not self._message_open:
                out += self._open_message()
            logprobs = o.logprobs(choice)
            out += [self._event("response.output_text.done", **self._at(), text=text, logprobs=logprobs),
                    self._event("response.content_part.done", **self._at(), part=o.text_part(text, logprobs)),
                    self._event("response.output_item.done", output_index=0,
                                item=o.message(text, logprobs, item_status))]
        first = 1 if self._message_open else 0
        for i, call in enumerate(calls, start=first):
            at = {"item_id": call["id"], "output_index": i}
            out += [self._event("response.output_item.added", output_index=i,
                                item={**call, "arguments": "", "status": "in_progress"}),
                    self._event("response.function_call_arguments.delta", **at, delta=call["arguments"]),
                    self._event("response.function_call_arguments.done", **at, arguments=call["arguments"]),
                    self._event("response.output_item.done", output_index=i, item=call)]
        return out + [self._event(f"response.{status}", response=o.response(status, choice))]

    def on_failure(self, error: ApiError, choices: list[Choice]) -> list[bytes]:
        failed = self.obj.response("failed")
        failed["error"] = {"code": "server_error" if error.status >= 500 else "invalid_request",
                           "message": error.message}
        return [self._event("error", code=failed["error"]["code"], message=error.message, param=error.param),
                self._event("response.failed", response=failed)]
