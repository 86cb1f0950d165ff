"""OpenAI's Responses API (/v1/responses), text in and out: the response object and its stream.

The request runs as a chat completion of one choice (``protocol.parse_responses`` translates it);
its answer is one output message with one output_text part. A stream sends OpenAI's events, each as
``event: <type>`` plus its JSON with ``type`` and ``sequence_number``: response.created,
response.in_progress, response.output_item.added, response.content_part.added, then
response.output_text.delta per piece of text, response.output_text.done, response.content_part.done,
response.output_item.done, and response.completed (response.incomplete when max_output_tokens cut
it short); an engine failure mid-stream sends error and response.failed.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from .responses import Choice, speculative_stats

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from .errors import ApiError


class ResponseObject:
    """Builds the response objects of one request (same id, message id and creation time)."""

    def __init__(self, model: str, method: str, n_prompt: int, echo: dict[str, Any]) -> None:
        self.id = "resp_" + uuid.uuid4().hex
        self.message_id = "msg_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.model = model
        self.method = method
        self.n_prompt = n_prompt
        self.echo = echo

    def response(self, status: str, choice: Choice | None = None) -> dict[str, Any]:
        """The response object; with ``choice`` (finished) its output, usage and status."""
        incomplete = None
        output: list[dict[str, Any]] = []
        usage = None
        spec = speculative_stats(self.method, [])
        if choice is not None:
            output = [self.message(choice, "completed" if status == "completed" else "incomplete")]
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
            n_out = len(choice.tokens)
            usage = {"input_tokens": self.n_prompt, "input_tokens_details": {"cached_tokens": choice.stats.n_cached if choice.stats else 0},
                     "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": self.n_prompt + n_out}
            spec = speculative_stats(self.method, [choice.stats] if choice.stats else [])
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": incomplete, "model": self.model, "output": output,
                "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "reasoning": None,
                "previous_response_id": None, "usage": usage, "speculative": spec, **self.echo}

    def message(self, choice: Choice | None, status: str) -> dict[str, Any]:
        content = [] if choice is None else [self.text_part("".join(choice.text))]
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant",
                "content": content}

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

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

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return (f"event: {kind}\ndata: ".encode() +
                json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.obj.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> list[bytes]:
        o = self.obj
        return [self._event("response.created", response=o.response("in_progress")),
                self._event("response.in_progress", response=o.response("in_progress")),
                self._event("response.output_item.added", output_index=0,
                            item=o.message(None, "in_progress")),
                self._event("response.content_part.added", **self._at(), part=o.text_part(""))]

    def on_chunk(self, chunk: GenerationChunk, choice: Choice, first: bool) -> list[bytes]:
        if not chunk.text:
            return []
        return [self._event("response.output_text.delta", **self._at(), delta=chunk.text, logprobs=[])]

    def closing(self, choices: list[Choice]) -> list[bytes]:
        o, choice = self.obj, choices[0]
        text = "".join(choice.text)
        status = o.status_of(choice)
        return [self._event("response.output_text.done", **self._at(), text=text, logprobs=[]),
                self._event("response.content_part.done", **self._at(), part=o.text_part(text)),
                self._event("response.output_item.done", output_index=0,
                            item=o.message(choice, "completed" if status == "completed" else "incomplete")),
                self._event(f"response.{status}", response=o.response(status, choice))]

    def on_failure(self, error: ApiError, choices: list[Choice]) -> list[bytes]:
        failed = self.obj.response("failed")
        failed["error"] = {"code": "server_error" if error.status >= 500 else "invalid_request",
                           "message": error.message}
        return [self._event("error", code=failed["error"]["code"], message=error.message, param=error.param),
                self._event("response.failed", response=failed)]
