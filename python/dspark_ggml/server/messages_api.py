"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), as llama-server serves it.

A request runs as a chat completion of one choice: ``system`` (a string or text blocks) becomes the
system message; ``messages`` alternate user and assistant turns whose content is a string or
blocks: text, an assistant's ``tool_use`` (a tool call) and a user's ``tool_result`` (a tool
message, its content a string or text blocks); ``tools`` ({name, description, input_schema}) and
``tool_choice`` (auto, any, tool, none) become function tools under the same call grammar as chat
completions; ``max_tokens`` (required), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``,
``stream``, and this server's own sampling fields (seed, min_p, speculative, ...) pass through.

The answer is a message whose content is a text block (when the model wrote text) and a
``tool_use`` block per call; ``stop_reason`` is end_turn, max_tokens, stop_sequence (with the
sequence) or tool_use. A stream sends Anthropic's events, each as ``event: <type>`` plus its JSON:
message_start, content_block_start / content_block_delta (text_delta, or input_json_delta for a
call) / content_block_stop per block, message_delta (the stop reason and output tokens),
message_stop; an engine failure mid-stream sends an error event. Errors have Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}``, with the status the rest of the API uses.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ApiError, bad_request
from .protocol import Fields, parse_translated_chat, refuse_fields
from .responses import Choice, speculative_stats, text_before_calls, text_held_back
from .timings import timings

if TYPE_CHECKING:
    from ..results import GenerationChunk
    from ..sampling import SamplingParams
    from .protocol import GenerationRequest
    from .responses import ResponseBuilder

# Messages fields passed to the chat completion as they are (the rest are translated below)
_CHAT_FIELDS = ("model", "temperature", "top_p", "top_k", "stream", "min_p", "seed", "speculative",
                "ignore_eos", "logit_bias", "presence_penalty", "frequency_penalty", "repeat_penalty",
                "penalty_last_n", "grammar", "json_schema", "cache_prompt")
# fields this server does not implement: refused when they ask for something
_UNSUPPORTED = {"thinking": (None, {"type": "disabled"}), "container": (None,), "mcp_servers": (None, []),
                "context_management": (None,)}
# chat names -> Anthropic's (the first that prefixes a parameter applies)
_PARAMS = {"stop": "stop_sequences", "tool_choice": "tool_choice", "tools": "tools"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}
_STOP_REASONS = {"length": "max_tokens", "context_full": "max_tokens"}


@dataclass
class MessagesRequest:
    chat: GenerationRequest
    stop_sequences: list[str]


def anthropic_error(e: ApiError) -> dict[str, Any]:
    """The error body Anthropic's clients read (their exception class comes from the status)."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def parse_messages(body: Any, defaults: SamplingParams, n_slots: int, *,
                   counting: bool = False) -> MessagesRequest:
    """A Messages request as a chat completion; ``counting``: for count_tokens (no max_tokens)."""
    f = Fields(body)
    refuse_fields(f, _UNSUPPORTED)
    metadata = f.body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request("'metadata' must be an object", "metadata")
    chat_body: dict[str, Any] = {k: f.body[k] for k in _CHAT_FIELDS if k in f.body}
    system = _system(f.body.get("system"))
    chat_body["messages"] = ([{"role": "system", "content": system}] if system else []) + \
        _messages(f.body.get("messages"))
    if not counting:
        if "max_tokens" not in f.body:
            raise bad_request("'max_tokens' is required", "max_tokens")
        chat_body["max_tokens"] = f.body["max_tokens"]
    stops = f.body.get("stop_sequences")
    if stops is not None:
        if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
            raise bad_request("'stop_sequences' must be a list of non-empty strings", "stop_sequences")
        chat_body["stop"] = stops
    tools = _tools(f.body.get("tools"))
    if tools:
        chat_body["tools"] = tools
    choice = f.body.get("tool_choice")
    if choice is not None:
        chat_body["tool_choice"] = _tool_choice(choice)
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            chat_body["parallel_tool_calls"] = False
    chat = parse_translated_chat(chat_body, defaults, n_slots, _PARAMS)
    chat.endpoint = "messages"
    chat.include_usage = False
    return MessagesRequest(chat, list(stops or []))


def _text_of(blocks: Any, param: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"'{param}' must be a string or a list of text blocks", param)
    texts = []
    for j, block in enumerate(blocks):
        if not _is_text(block):
            at = f"{param}[{j}]"
            raise bad_request(f"'{at}' must be a text block ({{type: 'text', text}})", at)
        texts.append(block["text"])
    return "".join(texts)


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def _system(v: Any) -> str | None:
    return None if v is None else _text_of(v, "system")


def _messages(v: Any) -> list[dict[str, Any]]:
    """The turns as chat messages: an assistant's tool_use blocks are its tool calls, a user's
    tool_result blocks the tool messages answering them (before the user's own text)."""
    if not isinstance(v, list) or not v:
        raise bad_request("'messages' must be a non-empty list of {role, content}", "messages")
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, m in enumerate(v):
        param = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"'{param}.role' must be 'user' or 'assistant'", f"{param}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise bad_request(f"'{param}.content' must be a string or a list of blocks", f"{param}.content")
        if m["role"] == "assistant":
            out.append(_assistant_turn(content, f"{param}.content", calls))
        else:
            out += _user_turn(content, f"{param}.content", calls)
    if v[-1].get("role") == "assistant":
        raise bad_request("the last message must be the user's: an assistant prefill is not supported here",
                          f"messages[{len(v) - 1}].role")
    return out


def _assistant_turn(blocks: list[Any], param: str, calls: set[str]) -> dict[str, Any]:
    texts, tool_calls = [], []
    for j, b in enumerate(blocks):
        at = f"{param}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if _is_text(b):
            texts.append(b["text"])
        elif kind == "tool_use":
            if not (isinstance(b.get("id"), str) and isinstance(b.get("name"), str)
                    and isinstance(b.get("input"), dict)):
                raise bad_request(f"'{at}': a tool_use block needs a string id and name and an object input",
                                  at)
            calls.add(b["id"])
            tool_calls.append({"id": b["id"], "type": "function",
                               "function": {"name": b["name"], "arguments": json.dumps(b["input"])}})
        else:
            raise bad_request(f"'{at}': an assistant's blocks are text and tool_use here; got {kind!r}", at)
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if tool_calls else "")}
    if tool_calls:
        turn["tool_calls"] = tool_calls
    return turn


def _user_turn(blocks: list[Any], param: str, calls: set[str]) -> list[dict[str, Any]]:
    out, texts = [], []
    for j, b in enumerate(blocks):
        at = f"{param}[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if _is_text(b):
            texts.append(b["text"])
        elif kind == "tool_result":
            if b.get("tool_use_id") not in calls:
                raise bad_request(f"'{at}': a tool_result needs the tool_use with its tool_use_id in an "
                                  "earlier assistant message", at)
            result = _text_of(b.get("content", ""), f"{at}.content")
            if b.get("is_error"):
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": result})
        else:
            raise bad_request(f"'{at}': a user's blocks are text and tool_result here; got {kind!r}", at)
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(v: Any) -> list[dict[str, Any]]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad_request("'tools' must be a list of {name, description, input_schema}", "tools")
    out = []
    for i, t in enumerate(v):
        if not (isinstance(t, dict) and t.get("type") in (None, "custom") and isinstance(t.get("name"), str)
                and isinstance(t.get("input_schema"), dict)):
            raise bad_request(f"'tools[{i}]' must be a client tool {{name, description, input_schema}}",
                              f"tools[{i}]")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: Any) -> Any:
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(v.get("name"), str):
        return {"type": "function", "function": {"name": v["name"]}}
    raise bad_request("'tool_choice' must be {type: 'auto' | 'any' | 'none'} or {type: 'tool', name}",
                      "tool_choice")


class MessageObject:
    """The message of one request (same id in its whole form and in its stream)."""

    def __init__(self, builder: ResponseBuilder, stop_sequences: list[str], detokenize: Any) -> None:
        self.b = builder
        self.id = "msg_" + uuid.uuid4().hex
        self.stop_sequences = stop_sequences
        self.detokenize = detokenize
        self._calls: list[dict[str, Any]] | None = None

    def calls(self, choice: Choice) -> list[dict[str, Any]]:
        """The answer's tool_use blocks (parsed once: their ids stay the same)."""
        if self._calls is None:
            parsed = self.b.tool_calls(choice)
            self._calls = [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                            "name": c["function"]["name"], "input": json.loads(c["function"]["arguments"])}
                           for c in (parsed.calls if parsed is not None else [])]
        return self._calls

    def stop(self, choice: Choice) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence): the stop sequence is the one the text was cut before."""
        if choice.finish_reason in _STOP_REASONS:
            return _STOP_REASONS[choice.finish_reason], None
        if self.calls(choice):
            return "tool_use", None
        if self.stop_sequences and choice.tokens:
            text = "".join(choice.text)
            full = self.detokenize(choice.tokens)
            for s in self.stop_sequences:
                if full.startswith(s, len(text)):
                    return "stop_sequence", s
        return "end_turn", None

    def usage(self, choice: Choice | None) -> dict[str, Any]:
        cached = choice.stats.n_cached if choice is not None and choice.stats else 0
        return {"input_tokens": self.b.n_prompt - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0, "output_tokens": len(choice.tokens) if choice else 0}

    def message(self, choice: Choice | None) -> dict[str, Any]:
        """The message; without ``choice``, as message_start shows it (no content yet)."""
        content: list[dict[str, Any]] = []
        reason = sequence = None
        if choice is not None:
            text = self.b.answer_text(choice)
            content = ([{"type": "text", "text": text}] if text or not self.calls(choice) else []) + \
                self.calls(choice)
            reason, sequence = self.stop(choice)
        stats = [choice.stats] if choice is not None and choice.stats else []
        out = {"id": self.id, "type": "message", "role": "assistant", "model": self.b.model,
               "content": content, "stop_reason": reason, "stop_sequence": sequence,
               "usage": self.usage(choice),
               "speculative": speculative_stats(self.b.method, stats)}
        t = timings([choice]) if choice is not None else None
        if t is not None:
            out["timings"] = t
        return out


class MessageStream:
    """The Messages API's stream events (a :class:`generation.StreamFormat`)."""

    def __init__(self, obj: MessageObject) -> None:
        self.obj = obj
        self._text_open = False
        self._tools = obj.b.extras.tools is not None

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields}
        return (f"event: {kind}\ndata: ".encode() +
                json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")

    def opening(self) -> list[bytes]:
        return [self._event("message_start", message=self.obj.message(None))]

    def _delta(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = [] if self._text_open else self._open_text()
        return out + [self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})]

    def _open_text(self) -> list[bytes]:
        self._text_open = True
        return [self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})]

    def on_chunk(self, chunk: GenerationChunk, choice: Choice, first: bool) -> list[bytes]:
        if not self._tools:
            return self._delta(chunk.text)
        text = text_before_calls(choice)
        return self._delta(text)

    def closing(self, choices: list[Choice]) -> list[bytes]:
        o, choice = self.obj, choices[0]
        out = []
        if self._tools:
            out += self._delta(text_held_back(choice, o.b.tool_calls(choice)))
        calls = o.calls(choice)
        if not self._text_open and not calls:  # an empty answer still has its (empty) text block
            out += self._open_text()
        if self._text_open:
            out.append(self._event("content_block_stop", index=0))
        first = 1 if self._text_open else 0
        for i, call in enumerate(calls, start=first):
            arguments = {"type": "input_json_delta", "partial_json": json.dumps(call["input"])}
            out += [self._event("content_block_start", index=i, content_block={**call, "input": {}}),
                    self._event("content_block_delta", index=i, delta=arguments),
                    self._event("content_block_stop", index=i)]
        reason, sequence = o.stop(choice)
        out.append(self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                               usage={"output_tokens": len(choice.tokens)}))
        return out + [self._event("message_stop")]

    def on_failure(self, error: ApiError, choices: list[Choice]) -> list[bytes]:
        return [self._event("error", error=anthropic_error(error)["error"])]
