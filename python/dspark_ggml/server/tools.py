"""Tool calling for chat requests: ``tools`` and ``tool_choice`` validated, shown to the model, the
calls it must make constrained by a grammar, and its calls parsed back into ``tool_calls``.

The format is the Hermes / Qwen one that many ChatML models were trained on: the tools are listed
as JSON inside ``<tools></tools>`` in the system prompt, and the model answers a call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. A chat template that takes
``tools`` itself (its source names them) renders them its own way; the calls are parsed the same.
"required" and a named function constrain the output to one or more such calls (the arguments
valid under the function's parameter schema); "auto" leaves the model free and parses whatever
calls it wrote; "none" neither shows nor parses them.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .errors import bad_request

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names
_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ToolChoice:
    """A chat request's validated tools: the functions, and "auto", "none", "required" or one
    function's name (``forced``)."""

    tools: list[dict[str, Any]]
    mode: str = "auto"
    forced: str | None = None
    parallel: bool = True
    names: list[str] = field(default_factory=list)

    @property
    def constrained(self) -> bool:
        return self.mode == "required" or self.forced is not None

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.mode != "none"


def parse_tools(body: dict[str, Any]) -> ToolChoice | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request; None without tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of {type: function, function: {...}} objects", "tools")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise bad_request("'tools' names a function twice", "tools")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    mode, forced = _choice(choice, names)
    return ToolChoice(checked, mode, forced, parallel, names)


def _tool(t: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
        raise bad_request(f"{param} must be {{type: 'function', function: {{name, parameters}}}}", param)
    fn = t["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"{param}.function.name must be 1-64 letters, digits, '_', '.' or '-'",
                          f"{param}.function.name")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema object",
                          f"{param}.function.parameters")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise bad_request(f"{param}.function.description must be a string", f"{param}.function.description")
    out = {"name": name, "parameters": params}
    if fn.get("description"):
        out["description"] = fn["description"]
    return {"type": "function", "function": out}


def _choice(v: Any, names: list[str]) -> tuple[str, str | None]:
    if v is None:
        return "auto", None
    if v in ("auto", "none", "required"):
        return v, None
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict):
        name = v["function"].get("name")
        if name not in names:
            raise bad_request(f"'tool_choice' names function {name!r}, which is not in 'tools' "
                              f"({', '.join(names)})", "tool_choice")
        return "function", name
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{type: 'function', function: {name}}", "tool_choice")


# ---- showing the tools to the model ---------------------------------------------------------------

def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself."""
    return template is not None and "tools" in template


def tools_system_prompt(choice: ToolChoice) -> str:
    """The system prompt text that lists the tools and the call format (Hermes style)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in choice.tools)
    return ("These functions can be called to answer the user; their JSON schemas are listed between "
            "<tools> and </tools>:\n<tools>\n" + listed + "\n</tools>\n"
            f"To call one, write a JSON object with its name and its arguments between {OPEN} and {CLOSE}:\n"
            f"{OPEN}\n" + '{"name": "function name", "arguments": {"argument": "value"}}' + f"\n{CLOSE}")


def with_tools(messages: list[dict[str, Any]], choice: ToolChoice) -> list[dict[str, Any]]:
    """The messages with the tools' system prompt first (merged into a system message there),
    and earlier assistant tool calls written in the call format the model is asked to use."""
    prompt = tools_system_prompt(choice)
    out = as_plain_messages(messages)
    if out and out[0]["role"] in ("system", "developer"):
        out[0] = {**out[0], "role": "system", "content": f"{out[0]['content']}\n\n{prompt}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def as_plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that knows no tools: earlier calls and results written as text."""
    return [_as_text(m) for m in messages]


def _as_text(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if m["role"] == "assistant" and calls:
        text = "".join(f"{OPEN}\n" + json.dumps({"name": c["function"]["name"],
                                                   "arguments": c["function"]["arguments"]},
                                                  ensure_ascii=False) + f"\n{CLOSE}\n" for c in calls)
        return {"role": "assistant", "content": (m.get("content") or "") + text}
    if m["role"] == "tool":
        return {"role": "tool", "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"}
    return {k: v for k, v in m.items() if k != "tool_calls"}


# ---- constraining and parsing the calls ------------------------------------------------------------

def call_grammar(choice: ToolChoice) -> str:
    """Lark (llguidance's dialect) for the output of a constrained request: one call (or several,
    with parallel_tool_calls) of the forced function or any of them, each valid under its schema."""
    names = [choice.forced] if choice.forced is not None else choice.names
    by_name = {t["function"]["name"]: t["function"] for t in choice.tools}
    alternatives = [{"type": "object",
                     "properties": {"name": {"const": n}, "arguments": by_name[n]["parameters"]},
                     "required": ["name", "arguments"], "additionalProperties": False} for n in names]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    schema = {**schema, "x-guidance": _COMPACT_JSON}
    repeat = "+" if choice.parallel else ""
    return (f"start: call{repeat}\n"
            f"call: {json.dumps(OPEN + chr(10))} body {json.dumps(chr(10) + CLOSE + chr(10))}\n"
            f"body: %json {json.dumps(schema)}\n")


@dataclass
class ParsedCalls:
    """An answer split into its text and its tool calls (OpenAI's message.tool_calls entries);
    ``outside``: the text around the calls as it was (``content`` is it stripped)."""

    content: str
    calls: list[dict[str, Any]]
    outside: str = ""


def streamable(text: str) -> int:
    """How much of a streamed answer can be sent as text now: all of it before a call's opening
    tag, less a tail that may still become one."""
    at = text.find(OPEN)
    if at >= 0:
        return at
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return len(text) - n
    return len(text)


def parse_calls(text: str, choice: ToolChoice) -> ParsedCalls:
    """The calls the model wrote (well-formed JSON with a known function's name, in order) and the
    text around them; a call that does not parse stays text."""
    calls: list[dict[str, Any]] = []
    rest: list[str] = []
    pos = 0
    for m in _CALL.finditer(text):
        call = _call(m.group(1), choice)
        if call is None:
            continue
        rest.append(text[pos:m.start()])
        pos = m.end()
        calls.append(call)
    rest.append(text[pos:])
    outside = "".join(rest) if calls else text
    return ParsedCalls(outside.strip() if calls else text, calls, outside)


def _call(body: str, choice: ToolChoice) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in choice.names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": arguments}}
