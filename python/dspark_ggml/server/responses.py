"""OpenAI's response objects: whole completions, streamed chunks, usage, and our speculative stats.

Besides OpenAI's fields every response carries ``speculative``: the method, draft tokens sent to
verification, how many the target accepted, the acceptance rate and tau (tokens per verify step,
the target's own included), summed over the request's choices. In a stream each choice's last chunk
carries its own, and the usage chunk (``stream_options.include_usage``) the sum.

And llama-server's ``timings`` (timings.py): in a whole response the request's; in a stream where
llama-server puts them, on the last event of a choice's end: its finish chunk, or for chat with
``include_usage`` the usage chunk (the sum); a completions stream's usage chunk has the sum too.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..engine import SpecStats
from .logprobs import LogprobText, NoLogprob, chat_entries, completion_logprobs
from .timings import timings
from .tools import ParsedCalls, ToolChoice, parse_calls, streamable

# our finish reasons -> OpenAI's ("context_full" is a length limit to an OpenAI client)
FINISH = {"stop": "stop", "length": "length", "context_full": "length"}


@dataclass
class Choice:
    """What one choice has produced so far; ``logprobs``: one entry per token of its text (the
    token that ended it has none), ``prompt_logprobs``: the prompt's tokens after the first (echo)."""

    index: int
    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: SpecStats | None = None
    logprobs: list[Any] = field(default_factory=list)
    prompt_logprobs: list[Any] | None = None
    n_chars: int = 0  # characters of text sent so far (a stream's text_offset)
    n_streamed: int = 0  # with tools: characters of the answer streamed as content so far


def text_before_calls(choice: Choice) -> str:
    """With tools, as a stream goes: the answer's new text up to where a tool call starts (or may
    start); the rest is held back until the answer ends and its calls are parsed."""
    full = "".join(choice.text)
    end = max(streamable(full), choice.n_streamed)
    text, choice.n_streamed = full[choice.n_streamed:end], end
    return text


def text_held_back(choice: Choice, calls: ParsedCalls | None) -> str:
    """With tools, at the answer's end: the text held back, less the calls parsed from it."""
    held = (calls.outside if calls is not None else "".join(choice.text))[choice.n_streamed:]
    return held.rstrip() if calls is not None else held


@dataclass
class Extras:
    """What a request asked for beyond text: logprobs, the prompt echoed (completions: each prompt's
    text and tokens), tools whose calls are parsed (chat)."""

    logprobs: bool = False
    text: LogprobText | None = None
    echo: list[str] | None = None
    prompts: list[list[int]] | None = None
    tools: ToolChoice | None = None


class ResponseBuilder:
    """Builds the objects of one request: same id, creation time and model in each of them."""

    def __init__(self, endpoint: str, model: str, method: str, n_prompt: int, fingerprint: str = "",
                 include_usage: bool = False, n: int = 1, extras: Extras | None = None) -> None:
        self.extras = extras or Extras()
        self.chat = endpoint == "chat.completions"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.method = method
        self.n_prompt = n_prompt  # summed over the prompts
        self.fingerprint = fingerprint
        self.include_usage = include_usage
        self.n = n  # choices per prompt

    # ---- whole responses --------------------------------------------------------------------------

    def completion(self, choices: list[Choice]) -> dict[str, Any]:
        out = {**self._head("chat.completion" if self.chat else "text_completion"),
               "choices": [self._choice(c) for c in choices], **self.usage(choices)}
        return _with_timings(out, choices)

    def _choice(self, c: Choice) -> dict[str, Any]:
        text = "".join(c.text)
        finish = FINISH.get(c.finish_reason or "", c.finish_reason)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            calls = self.tool_calls(c)
            if calls is not None:
                message = {"role": "assistant", "content": calls.content or None, "tool_calls": calls.calls}
                finish = "tool_calls" if finish == "stop" else finish
            return {"index": c.index, "message": message, "logprobs": self.chat_logprobs(c.logprobs),
                    "finish_reason": finish}
        logprobs = None
        if self.extras.logprobs:
            logprobs = completion_logprobs(self._echoed_logprobs(c) + c.logprobs, self._text)
        return {"index": c.index, "text": self.echo_text(c.index) + text, "logprobs": logprobs,
                "finish_reason": finish}

    def tool_calls(self, c: Choice) -> ParsedCalls | None:
        """The tool calls a chat choice made (None: no tools, or it made none)."""
        if self.extras.tools is None:
            return None
        parsed = parse_calls("".join(c.text), self.extras.tools)
        return parsed if parsed.calls else None

    def answer_text(self, c: Choice) -> str:
        """A chat choice's text: around its tool calls when it made some."""
        parsed = self.tool_calls(c)
        return parsed.content if parsed is not None else "".join(c.text)

    def chat_logprobs(self, entries: list[Any]) -> dict[str, Any] | None:
        if not self.extras.logprobs:
            return None
        return {"content": chat_entries(entries, self._text), "refusal": None}

    def completion_chunk_logprobs(self, c: Choice, entries: list[Any], offset: int) -> dict[str, Any] | None:
        return completion_logprobs(entries, self._text, offset) if self.extras.logprobs else None

    def echo_text(self, index: int) -> str:
        """The prompt text a completions choice starts with when the request asked for echo."""
        return self.extras.echo[index // self.n] if self.extras.echo is not None else ""

    def _echoed_logprobs(self, c: Choice) -> list[Any]:
        e = self.extras
        if e.echo is None or e.prompts is None:
            return []
        prompt = e.prompts[c.index // self.n]
        return [NoLogprob(prompt[0]), *(c.prompt_logprobs or [])]

    @property
    def _text(self) -> LogprobText:
        if self.extras.text is None:
            self.extras.text = LogprobText(None)
        return self.extras.text

    # ---- streamed chunks --------------------------------------------------------------------------

    def chunk(self, index: int, text: str, finish_reason: str | None = None, *,
              first: bool = False, stats: SpecStats | None = None, logprobs: dict[str, Any] | None = None,
              tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A chunk of choice ``index``; its last (``finish_reason``) carries its speculative stats.
        ``logprobs``: the logprobs object of its tokens; ``tool_calls``: the calls (chat, whole)."""
        finish = FINISH.get(finish_reason or "", finish_reason) if finish_reason else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else \
                ({"content": text} if text or not (finish or logprobs) else {})
            if tool_calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
                finish = "tool_calls" if finish == "stop" else finish
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        out = {**self._head(self._chunk_object), "choices": [choice]}
        if self.include_usage:
            out["usage"] = None  # as OpenAI: null in every chunk but the last
        if finish_reason is not None:
            out["speculative"] = speculative_stats(self.method, [stats] if stats else [])
        return out

    def finish_chunk(self, choice: Choice, *, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The chunk that ends a streamed choice; it carries the choice's timings unless a chat
        usage chunk follows (llama-server puts them on the last event only)."""
        out = self.chunk(choice.index, "", choice.finish_reason, stats=choice.stats, tool_calls=tool_calls)
        return out if self.chat and self.include_usage else _with_timings(out, [choice])

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        """The last chunk of a stream that asked for it (stream_options.include_usage): no choices,
        the usage, the speculative stats and the timings of every choice."""
        out = {**self._head(self._chunk_object), "choices": [], **self.usage(choices)}
        return _with_timings(out, choices)

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    # ---- shared -----------------------------------------------------------------------------------

    def usage(self, choices: list[Choice]) -> dict[str, Any]:
        n_completion = sum(len(c.tokens) for c in choices)
        return {"usage": {"prompt_tokens": self.n_prompt, "completion_tokens": n_completion,
                          "total_tokens": self.n_prompt + n_completion,
                          "prompt_tokens_details": {"cached_tokens": self._cached(choices)}},
                "speculative": speculative_stats(self.method, [c.stats for c in choices if c.stats])}

    def _cached(self, choices: list[Choice]) -> int:
        """Prompt tokens the prompt cache served: per prompt (prompt_tokens counts each once), what
        the least served of its choices reused."""
        per_prompt: dict[int, int] = {}
        for c in choices:
            n = c.stats.n_cached if c.stats else 0
            per_prompt[c.index // self.n] = min(per_prompt.get(c.index // self.n, n), n)
        return sum(per_prompt.values())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}


def _with_timings(out: dict[str, Any], choices: list[Choice]) -> dict[str, Any]:
    t = timings(choices)
    if t is not None:
        out["timings"] = t
    return out


def speculative_stats(method: str, stats: list[SpecStats]) -> dict[str, Any]:
    """Draft counters summed over choices (tau recomputed from the sums, as the engine defines it)."""
    total = SpecStats(n_steps=sum(s.n_steps for s in stats), n_drafted=sum(s.n_drafted for s in stats),
                      n_accepted=sum(s.n_accepted for s in stats))
    return {"method": method, "drafted": total.n_drafted, "accepted": total.n_accepted,
            "acceptance_rate": total.acceptance_rate, "tau": total.mean_accepted_length,
            "steps": total.n_steps}
