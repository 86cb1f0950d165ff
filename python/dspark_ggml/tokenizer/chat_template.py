"""Render a GGUF's chat template (Jinja) the way Hugging Face transformers does.

Same environment settings as transformers' apply_chat_template: a sandboxed, immutable
Jinja environment with trim_blocks and lstrip_blocks, the loop-controls extension
({% break %}, {% continue %}), a `{% generation %}` block that renders its body, a tojson
filter that keeps non-ASCII text and takes indent/separators/sort_keys, and the globals
raise_exception(message) and strftime_now(format).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ChatTemplateError


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks).

    Renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which chat templates must not do.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile (and cache) a chat template."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to templates: keys with None values dropped (templates
    handle a missing key better than a None), and a message's reasoning available both as
    `reasoning_content` and as `thinking`, whichever of the usual names it came under."""
    prepared: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"chat messages must be mappings, got {type(message).__name__}")
        plain = {k: v for k, v in message.items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_KEYS if k in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        prepared.append(plain)
    return prepared


def render_chat(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
                tools: Sequence[Mapping[str, Any]] | None, context: Mapping[str, Any]) -> str:
    """Render `source` for `messages`; `context` adds variables (special-token strings, kwargs)."""
    template = compile_template(source)
    try:
        variables: dict[str, Any] = {"documents": None, **context}
        return template.render(messages=prepare_messages(messages),
                               tools=list(tools) if tools is not None else None,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed: {exc}") from exc
