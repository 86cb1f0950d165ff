"""Request bodies of the OpenAI-compatible endpoints: parsed, type-checked, validated (else 400).

Fields a request leaves out (or sends as null) take the server's defaults (``dspark-ggml serve``'s
sampling flags). Fields of OpenAI's API that this server does not implement are refused when they
ask for something (``suffix``, ``functions``) rather than silently ignored; other unknown fields
are ignored, as OpenAI-compatible servers do.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..errors import InvalidArgumentError
from ..sampling import SamplingParams
from ..structured import gbnf_grammar, json_schema_grammar, lark_grammar
from .engines import SpecOverride, with_ignore_eos
from .errors import ApiError, bad_request
from .tools import ToolChoice, call_grammar, parse_tools

SEED_LIMIT = 2**32 - 1
INT32_MAX = 2**31 - 1  # the C API's counts are int32_t
MAX_STOPS = 16
MAX_EMBEDDING_INPUTS = 2048  # as OpenAI
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20  # as OpenAI's chat API
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit_bias value
# field -> the value that means "not used": anything else is refused as not implemented
_UNSUPPORTED = {"suffix": (None, ""), "functions": (None, []), "function_call": (None, "none", "auto")}
# chat-only fields a completions request may not send
_CHAT_ONLY = {"tools": (None, []), "tool_choice": (None, "none", "auto"), "top_logprobs": (None,)}


Prompt = Any  # a text (str) or token ids (list[int])


@dataclass
class GenerationRequest:
    """A validated /v1/completions, /v1/chat/completions or /v1/responses request.

    ``speculative`` is the request's engine setting: its ``speculative`` field and ``ignore_eos``.
    """

    endpoint: str                         # "completions", "chat.completions" or "responses"
    prompts: list[Prompt] | None          # completions: one or more, each n choices
    messages: list[dict[str, Any]] | None  # chat, responses
    sampling: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    speculative: SpecOverride | None
    cache_prompt: bool = True  # may reuse a cached prefix of its prompt (llama-server's field)
    echo: bool = False  # completions: the prompt comes first in each choice's text (and logprobs)
    tools: ToolChoice | None = None  # chat: the functions the model may call, shown and parsed

    @property
    def n_sequences(self) -> int:
        return self.n * (len(self.prompts) if self.prompts is not None else 1)


@dataclass
class EmbeddingsRequest:
    """A validated /v1/embeddings request."""

    inputs: list[Prompt]
    base64: bool
    dimensions: int | None


class Fields:
    """Typed access to a JSON object's fields; a wrong type or range is a 400 naming the field."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        self.body = body

    def given(self, name: str) -> bool:
        return self.body.get(name) is not None

    def integer(self, name: str, default: Any, lo: int | None = None, hi: int | None = None) -> Any:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad_request(f"'{name}' must be an integer, got {_json_type(v)}", name)
        _check_range(name, v, lo, hi)
        return v

    def number(self, name: str, default: Any, lo: float | None = None, hi: float | None = None) -> Any:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            got = _json_type(v) if not isinstance(v, float) else repr(v)
            raise bad_request(f"'{name}' must be a finite number, got {got}", name)
        _check_range(name, v, lo, hi)
        return float(v)

    def boolean(self, name: str, default: bool) -> bool:
        return self._of_type(name, default, bool, "true or false")

    def string(self, name: str, default: Any) -> Any:
        return self._of_type(name, default, str, "a string")

    def _of_type(self, name: str, default: Any, kind: type, what: str) -> Any:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, kind):
            raise bad_request(f"'{name}' must be {what}, got {_json_type(v)}", name)
        return v


def parse_completion(body: Any, defaults: SamplingParams, n_slots: int,
                     max_sequences: int | None = None) -> GenerationRequest:
    """A completions request; ``max_sequences``: the most sequences (prompts x n) the server
    admits at once (more are refused: they could never run)."""
    f = Fields(body)
    _refuse_unsupported(f, _CHAT_ONLY)
    req = _generation(f, "completions", _prompts(f), None, defaults, n_slots)
    req.echo = f.boolean("echo", False)
    if req.echo and req.stream and req.sampling.logprobs is not None:
        raise bad_request("'echo' with 'logprobs' is not supported when streaming", "echo")
    if max_sequences is not None and req.n_sequences > max_sequences:
        raise bad_request(f"{len(req.prompts or [])} prompts x n={req.n} = {req.n_sequences} sequences; this "
                          f"server admits at most {max_sequences} at once (slots + queue)", "prompt")
    return req


def parse_chat(body: Any, defaults: SamplingParams, n_slots: int) -> GenerationRequest:
    f = Fields(body)
    _refuse_unsupported(f)
    req = _generation(f, "chat.completions", None, _messages(f), defaults, n_slots)
    tools = parse_tools(f.body)
    if tools is not None and tools.active:
        req.tools = tools
        if tools.constrained:
            if req.sampling.json_schema is not None or req.sampling.grammar is not None:
                given = next(n for n in ("response_format", "json_schema", "grammar") if f.body.get(n) is not None)
                raise bad_request(f"'{given}' and a required tool call cannot both constrain the output", given)
            req.sampling = replace(req.sampling, grammar=lark_grammar(call_grammar(tools)))
    return req


def parse_embeddings(body: Any) -> EmbeddingsRequest:
    """``input``: a string, a list of strings, token ids or a list of token-id lists;
    ``encoding_format``: "float" (default) or "base64"; ``dimensions``: checked by the caller."""
    f = Fields(body)
    f.string("model", None)
    f.string("user", None)
    v = f.body.get("input")
    if v is None:
        raise bad_request("'input' is required", "input")
    inputs = _prompt_list(v, "input")
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise bad_request(f"'input' takes at most {MAX_EMBEDDING_INPUTS} items, got {len(inputs)}", "input")
    for i, x in enumerate(inputs):
        if isinstance(x, str) and not x:
            raise bad_request(f"input[{i}] is an empty string", "input")
    fmt = f.string("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    dimensions = f.integer("dimensions", None, lo=1, hi=INT32_MAX)
    return EmbeddingsRequest(inputs, fmt == "base64", dimensions)


# ---- the Responses API (/v1/responses), translated to a chat request ------------------------------

# fields copied to the chat request as they are (sampling, and our extensions)
_RESPONSES_CHAT_FIELDS = ("model", "temperature", "top_p", "stream", "top_k", "min_p", "seed", "stop",
                          "stop_token_ids", "speculative", "ignore_eos", "parallel_tool_calls", "logit_bias",
                          "presence_penalty", "frequency_penalty", "repeat_penalty", "penalty_last_n",
                          "grammar", "json_schema")
# Responses fields this server does not implement: refused when they ask for something
_RESPONSES_UNSUPPORTED = {"previous_response_id": (None,), "conversation": (None,), "prompt": (None,),
                          "background": (None, False), "max_tool_calls": (None,)}
# chat names -> ours (the first that prefixes a parameter applies)
_RESPONSES_PARAMS = {"max_tokens": "max_output_tokens", "messages": "input",
                     "response_format.json_schema": "text.format", "response_format": "text.format"}
_INPUT_PARTS = ("input_text", "output_text", "text")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class ResponsesRequest:
    """A validated /v1/responses request: the chat request it runs as, and what the response echoes."""

    chat: GenerationRequest
    echo: dict[str, Any]


def parse_responses(body: Any, defaults: SamplingParams, n_slots: int) -> ResponsesRequest:
    """OpenAI's Responses API: ``input`` (a string, or message, function_call and
    function_call_output items), ``instructions`` (a system message first), ``max_output_tokens``,
    function ``tools`` and ``tool_choice``, ``text.format`` (text, json_object, json_schema),
    ``top_logprobs`` / ``include: ["message.output_text.logprobs"]``, the sampling fields; run as a
    chat completion (as llama-server does)."""
    f = Fields(body)
    refuse_fields(f, _RESPONSES_UNSUPPORTED)
    metadata = f.body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and
                                     all(isinstance(v, str) for v in metadata.values())):
        raise bad_request("'metadata' must be an object of at most 16 string values", "metadata")
    instructions = f.string("instructions", None)
    chat_body: dict[str, Any] = {k: f.body[k] for k in _RESPONSES_CHAT_FIELDS if k in f.body}
    chat_body["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + \
        _response_input(f.body.get("input"))
    if f.body.get("max_output_tokens") is not None:
        chat_body["max_tokens"] = f.body["max_output_tokens"]
    tools = _response_tools(f.body.get("tools"))
    if tools:
        chat_body["tools"] = tools
    if f.body.get("tool_choice") is not None:
        chat_body["tool_choice"] = _response_tool_choice(f.body["tool_choice"])
    text_format = _text_format(f)
    if text_format is not None:
        chat_body["response_format"] = text_format
    top = _response_logprobs(f)
    if top is not None:
        chat_body["logprobs"], chat_body["top_logprobs"] = True, top
    chat = parse_translated_chat(chat_body, defaults, n_slots, _RESPONSES_PARAMS)
    chat.endpoint = "responses"
    chat.include_usage = False
    fmt = (f.body.get("text") or {}).get("format") or {"type": "text"}
    echo = {"instructions": instructions, "max_output_tokens": f.body.get("max_output_tokens"),
            "metadata": metadata or {}, "temperature": chat.sampling.temperature,
            "top_p": chat.sampling.top_p, "text": {"format": fmt}, "store": False, "truncation": "disabled",
            "tools": f.body.get("tools") or [], "tool_choice": f.body.get("tool_choice") or "auto",
            "parallel_tool_calls": f.body.get("parallel_tool_calls", True), "top_logprobs": top or 0}
    return ResponsesRequest(chat, echo)


def refuse_fields(f: Fields, unsupported: dict[str, tuple[Any, ...]]) -> None:
    """400 for a field this server does not implement, unless it holds one of the values that
    ask for nothing (``unsupported``: name -> those values)."""
    for name, unused in unsupported.items():
        if name in f.body and not any(f.body[name] == u and type(f.body[name]) is type(u) for u in unused):
            raise bad_request(f"'{name}' is not supported by this server", name)


def parse_translated_chat(chat_body: dict[str, Any], defaults: SamplingParams, n_slots: int,
                          names: dict[str, str]) -> GenerationRequest:
    """parse_chat on a body translated from another API; its errors name that API's fields
    (``names``: chat's -> theirs, the first that prefixes the faulty parameter applies)."""
    try:
        return parse_chat(chat_body, defaults, n_slots)
    except ApiError as e:
        param = e.param or ""
        for ours, theirs in names.items():
            if param.startswith(ours):
                e.param = theirs + param[len(ours):]
                e.message = e.message.replace(f"'{ours}", f"'{theirs}")
                break
        raise


def _text_format(f: Fields) -> dict[str, Any] | None:
    """``text.format`` as a chat response_format: text (None), json_object, or json_schema
    ({type, name, schema, strict}: the Responses API's flat shape)."""
    v = f.body.get("text")
    if v is None:
        return None
    fmt = v.get("format") if isinstance(v, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if not isinstance(v, dict) or (fmt is not None and kind not in ("text", "json_object", "json_schema")):
        raise bad_request("'text.format' must be {type: 'text'}, {type: 'json_object'} or "
                          "{type: 'json_schema', name, schema, strict}", "text.format")
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def _response_logprobs(f: Fields) -> int | None:
    """``top_logprobs`` (0..20) or ``include: ["message.output_text.logprobs"]`` -> the top count
    of each output token's logprobs (None: not asked for)."""
    include = f.body.get("include")
    if include is not None and not (isinstance(include, list) and all(x == _LOGPROBS_INCLUDE for x in include)):
        raise bad_request(f"'include' takes only \"{_LOGPROBS_INCLUDE}\" here", "include")
    top = f.integer("top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    return top if top is not None else (0 if include else None)


def _response_tools(v: Any) -> list[dict[str, Any]] | None:
    """Function tools of the Responses API ({type: function, name, description, parameters,
    strict}) as chat tools ({type: function, function: {...}})."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise bad_request("'tools' must be a list of function tools", "tools")
    out = []
    for i, t in enumerate(v):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad_request(f"tools[{i}]: only function tools ({{type: 'function', name, parameters}}) are "
                              "supported", f"tools[{i}]")
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                         "strict") if k in t}})
    return out


def _response_tool_choice(v: Any) -> Any:
    """``tool_choice``: none / auto / required, or {type: function, name} (the chat shape nests the name)."""
    if isinstance(v, dict) and v.get("type") == "function" and "name" in v:
        return {"type": "function", "function": {"name": v["name"]}}
    if v in ("none", "auto", "required"):
        return v
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or {type: 'function', name}",
                      "tool_choice")


def _response_input(v: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: a string is one user message; message items ({role, content}
    with a string or text parts) are messages; function_call items are the assistant's tool calls
    (consecutive ones in one message) and function_call_output items their results (tool messages)."""
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise bad_request("'input' must be a string or a non-empty list of input items", "input")
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, item in enumerate(v):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{param} must be an object (an input item)", param)
        kind = item.get("type", "message")
        if kind == "function_call":
            call = _function_call_item(item, param)
            calls.add(call["id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if call_id not in calls:
                raise bad_request(f"{param}: a function_call_output needs the function_call with its call_id "
                                  "earlier in the input", param)
            if not isinstance(output, str):
                raise bad_request(f"{param}.output must be a string", f"{param}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "message":
            out.append(_message_item(item, param))
        else:
            raise bad_request(f"{param}: input items are messages, function_call and function_call_output; "
                              f"got type {kind!r}", param)
    return out


def _function_call_item(item: dict[str, Any], param: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad_request(f"{param}.{key} must be a string", f"{param}.{key}")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _message_item(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(f"{param}.role must be one of user, assistant, system, developer", f"{param}.role")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in _INPUT_PARTS and isinstance(part.get("text"), str)):
                raise bad_request(f"{param}.content: only text parts (input_text, output_text) are supported",
                                  f"{param}.content")
            texts.append(part["text"])
        content = "".join(texts)
    elif not isinstance(content, str):
        raise bad_request(f"{param}.content must be a string or a list of text parts", f"{param}.content")
    return {"role": role, "content": content}


def parse_tokenize(body: Any) -> tuple[str, bool, bool, bool]:
    """(content, add_special, parse_special, with_pieces) of POST /tokenize (llama-server's fields)."""
    f = Fields(body)
    content = f.string("content", None)
    if content is None:
        raise bad_request("'content' (the text to tokenize) is required", "content")
    return content, f.boolean("add_special", False), f.boolean("parse_special", True), \
        f.boolean("with_pieces", False)


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    f = Fields(body)
    return _token_ids(f.body.get("tokens"), "tokens", n_vocab, allow_empty=True)


# ---- the pieces ---------------------------------------------------------------------------------

def _generation(f: Fields, endpoint: str, prompts: list[Prompt] | None,
                messages: list[dict[str, Any]] | None, defaults: SamplingParams,
                n_slots: int) -> GenerationRequest:
    f.string("model", None)  # one model is served: any name is accepted, but it must be a string
    stream = f.boolean("stream", False)
    include_usage = _include_usage(f)
    setting = with_ignore_eos(_speculative(f), f.boolean("ignore_eos", False))
    return GenerationRequest(endpoint, prompts, messages, _sampling(f, defaults, endpoint), _n(f, n_slots),
                             stream, stream and include_usage, setting, f.boolean("cache_prompt", True))


def _sampling(f: Fields, d: SamplingParams, endpoint: str) -> SamplingParams:
    chat_max = endpoint == "chat.completions" and f.given("max_completion_tokens")
    max_name = "max_completion_tokens" if chat_max else "max_tokens"
    top_k = f.integer("top_k", d.top_k, lo=-1, hi=INT32_MAX)
    logprobs = _chat_logprobs(f) if endpoint == "chat.completions" else \
        f.integer("logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    echo_logprobs = endpoint == "completions" and logprobs is not None and f.boolean("echo", False)
    return replace(d, max_tokens=f.integer(max_name, d.max_tokens, lo=1, hi=INT32_MAX),
                   temperature=f.number("temperature", d.temperature, lo=0.0),
                   top_p=_top_p(f, d.top_p), top_k=max(top_k, 0),  # -1 = off, as in vLLM
                   min_p=f.number("min_p", d.min_p, lo=0.0, hi=1.0),
                   seed=f.integer("seed", d.seed, lo=0, hi=SEED_LIMIT - 1),
                   stop=_stops(f, d.stop), stop_token_ids=_stop_token_ids(f, d.stop_token_ids),
                   logit_bias=_logit_bias(f, d.logit_bias),
                   presence_penalty=f.number("presence_penalty", d.presence_penalty, lo=-2.0, hi=2.0),
                   frequency_penalty=f.number("frequency_penalty", d.frequency_penalty, lo=-2.0, hi=2.0),
                   repeat_penalty=_repeat_penalty(f, d.repeat_penalty),
                   penalty_last_n=f.integer("penalty_last_n", d.penalty_last_n, lo=-1, hi=INT32_MAX),
                   logprobs=logprobs, prompt_logprobs=logprobs if echo_logprobs else None,
                   **_output_constraint(f, d))


def _chat_logprobs(f: Fields) -> int | None:
    """Chat: ``logprobs: true`` and ``top_logprobs`` (0..20) -> the top count, None = off."""
    top = f.integer("top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if not f.boolean("logprobs", False):
        if top:  # 0 asks for nothing: accepted, as clients send it
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _logit_bias(f: Fields, default: Any) -> Any:
    """``logit_bias``: {"token id": bias in [-100, 100]}; ids are checked against the vocabulary
    when the request's prompts are (prompts.choice_requests)."""
    v = f.body.get("logit_bias")
    if v is None:
        return default
    if not isinstance(v, dict):
        raise bad_request("'logit_bias' must be an object {\"token id\": bias}", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in v.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise bad_request(f"'logit_bias' keys must be token ids (non-negative integers), got {key!r}",
                              "logit_bias")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not math.isfinite(bias) \
                or abs(bias) > LOGIT_BIAS_LIMIT:
            raise bad_request(f"'logit_bias' values must be numbers in [-100, 100], got {bias!r} for token "
                              f"{key}", "logit_bias")
        out[int(key)] = float(bias)
    return out or None


def _repeat_penalty(f: Fields, default: float) -> float:
    v = f.number("repeat_penalty", default, lo=0.0)
    if v <= 0.0:
        raise bad_request("'repeat_penalty' must be > 0 (1 = off)", "repeat_penalty")
    return v


def _output_constraint(f: Fields, d: SamplingParams) -> dict[str, Any]:
    """What the output must follow, as SamplingParams fields: OpenAI's ``response_format``, or
    llama-server's top-level ``json_schema`` (an object; {} = any JSON object) or ``grammar`` (GBNF).
    At most one of the three; each is compiled here, so that a bad one is refused now."""
    given = [name for name in ("response_format", "json_schema", "grammar") if f.body.get(name) is not None]
    if len(given) > 1:
        raise bad_request(f"{' and '.join(repr(n) for n in given)} cannot both constrain the output: give one",
                          given[1])
    if "grammar" in given:
        gbnf = f.string("grammar", None)
        try:
            return {"grammar": gbnf_grammar(gbnf), "json_schema": None}
        except InvalidArgumentError as e:
            raise bad_request(str(e), "grammar") from e
    if "json_schema" in given:
        return {"json_schema": _schema(f.body["json_schema"], "json_schema"), "grammar": None}
    schema = _response_format(f)
    if schema is not None:
        return {"json_schema": schema, "grammar": None}
    return {"json_schema": d.json_schema, "grammar": d.grammar}  # the server's defaults (serve -j / --grammar)


def _response_format(f: Fields) -> dict[str, Any] | None:
    """``response_format``: text, json_object (any JSON object; llama-server's ``schema`` member
    narrows it) or json_schema ({name, schema, strict}) -> the JSON schema the output must follow
    (None = free text)."""
    v = f.body.get("response_format")
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return _schema(v.get("schema", {}), "response_format.schema")
    if kind != "json_schema":
        raise bad_request("'response_format' must be {type: 'text'}, {type: 'json_object'} or "
                          "{type: 'json_schema', json_schema: {name, schema}}", "response_format")
    spec = v.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("'response_format.json_schema' must be an object {name, schema, strict}",
                          "response_format.json_schema")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad_request("'response_format.json_schema.strict' must be true or false",
                          "response_format.json_schema.strict")
    return _schema(spec.get("schema", {}), "response_format.json_schema.schema")


def _schema(schema: Any, param: str) -> dict[str, Any]:
    """A JSON schema object, compiled once to refuse a bad one now; {} means any JSON object."""
    if not isinstance(schema, dict):
        raise bad_request(f"'{param}' must be a JSON schema object", param)
    schema = schema or {"type": "object"}
    try:
        json_schema_grammar(schema)
    except InvalidArgumentError as e:
        raise bad_request(str(e), param) from e
    return schema


def _top_p(f: Fields, default: float) -> float:
    v = f.number("top_p", default, lo=0.0, hi=1.0)
    if v <= 0.0:
        raise bad_request("'top_p' must be in (0, 1]", "top_p")
    return v


def _stops(f: Fields, default: Any) -> Any:
    v = f.body.get("stop")
    if v is None:
        return default
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' takes at most {MAX_STOPS} strings", "stop")
    return [s for s in stops if s]


def _stop_token_ids(f: Fields, default: Any) -> Any:
    v = f.body.get("stop_token_ids")
    if v is None:
        return default
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    return v


def _n(f: Fields, n_slots: int) -> int:
    return f.integer("n", 1, lo=1, hi=n_slots)


def _include_usage(f: Fields) -> bool:
    """Whether a stream ends with a usage chunk: only when stream_options.include_usage is true."""
    v = f.body.get("stream_options")
    if v is None:
        return False
    if not isinstance(v, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return Fields(v).boolean("include_usage", False)


def _speculative(f: Fields) -> SpecOverride | None:
    """``speculative``: false / {"enabled": false} (target only), or {"n_max": N, "p_min": P}."""
    v = f.body.get("speculative")
    if v is None or v is True:
        return None
    if v is False:
        return SpecOverride(off=True)
    if not isinstance(v, dict):
        raise bad_request("'speculative' must be false or an object {n_max, p_min, enabled}", "speculative")
    unknown = sorted(set(v) - {"n_max", "p_min", "enabled"})
    if unknown:
        raise bad_request(f"unknown 'speculative' field(s): {', '.join(unknown)}", "speculative")
    s = Fields(v)
    if not s.boolean("enabled", True):
        return SpecOverride(off=True)
    n_max, p_min = s.integer("n_max", None, lo=0, hi=INT32_MAX), s.number("p_min", None, lo=0.0, hi=1.0)
    return SpecOverride(n_max=n_max, p_min=p_min) if (n_max, p_min) != (None, None) else None


def _prompts(f: Fields) -> list[Prompt]:
    """One prompt or several: a text, token ids, or a list of texts and token-id lists."""
    v = f.body.get("prompt")
    if v is None:
        raise bad_request("'prompt' is required", "prompt")
    return _prompt_list(v, "prompt")


def _prompt_list(v: Any, name: str) -> list[Prompt]:
    if isinstance(v, str):
        return [v]
    what = (f"'{name}' must be a string, a list of token ids, or a list of strings and token-id lists")
    if not isinstance(v, list) or not v:
        raise bad_request(what if v != [] else f"'{name}' is empty", name)
    if all(_is_int(t) for t in v):
        return [_token_ids(v, name, None)]
    out: list[Prompt] = []
    for x in v:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list) and x and all(_is_int(t) for t in x):
            out.append(list(x))
        else:
            raise bad_request(what, name)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _token_ids(v: Any, name: str, n_vocab: int | None, allow_empty: bool = False) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        raise bad_request(f"'{name}' must be a string or a list of token ids" if name == "prompt"
                          else f"'{name}' must be a list of token ids", name)
    if not v and not allow_empty:
        raise bad_request(f"'{name}' is empty", name)
    if n_vocab is not None:
        _check_token_range(v, name, n_vocab)
    return list(v)


def _check_token_range(tokens: list[int], name: str, n_vocab: int) -> None:
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise bad_request(f"'{name}' has token ids outside the vocabulary (0 .. {n_vocab - 1}): {bad[:8]}",
                          name)


def check_prompt_tokens(tokens: list[int], n_vocab: int, name: str = "prompt") -> None:
    _check_token_range(tokens, name, n_vocab)


def _messages(f: Fields) -> list[dict[str, Any]]:
    v = f.body.get("messages")
    if not isinstance(v, list) or not v:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", "messages")
    return [_message(m, i) for i, m in enumerate(v)]


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{param} must be an object", param)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"{param}.role must be one of {', '.join(ROLES)}", f"{param}.role")
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), f"{param}.content")}
    for key in ("name", "reasoning_content", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = _tool_calls(m["tool_calls"], f"{param}.tool_calls")
    return out


def _tool_calls(v: Any, param: str) -> list[dict[str, Any]]:
    """An assistant message's earlier tool calls, as chat templates take them (arguments parsed)."""
    if not isinstance(v, list):
        raise bad_request(f"{param} must be a list of tool calls", param)
    out = []
    for i, call in enumerate(v):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise bad_request(f"{param}[{i}] must be {{type: 'function', function: {{name, arguments}}}}",
                              f"{param}[{i}]")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise bad_request(f"{param}[{i}].function.arguments is not valid JSON",
                                  f"{param}[{i}].function.arguments") from None
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


def _content(v: Any, param: str) -> str:
    """A message's content: a string, or a list of text parts (joined), or null (empty)."""
    if v is None or isinstance(v, str):
        return v or ""
    if isinstance(v, list):
        texts = []
        for part in v:
            text_part = isinstance(part, Mapping) and part.get("type") == "text"
            if not (text_part and isinstance(part.get("text"), str)):
                raise bad_request(f"{param}: only text parts ({{type: text, text}}) are supported", param)
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{param} must be a string or a list of text parts", param)


def _refuse_unsupported(f: Fields, endpoint_refuses: Mapping[str, tuple] | None = None) -> None:
    refused = {**_UNSUPPORTED, **(endpoint_refuses or {})}
    for name, unused in refused.items():
        if name in f.body and not any(f.body[name] == u and type(f.body[name]) is type(u) for u in unused):
            where = " on /v1/completions (it is a chat field)" if name in (endpoint_refuses or {}) else ""
            raise bad_request(f"'{name}' is not supported by this server{where}", name)
    best_of = f.body.get("best_of")
    if best_of is not None and best_of != f.body.get("n", 1):
        raise bad_request("'best_of' is not supported by this server", "best_of")


def _check_range(name: str, v: float, lo: float | None, hi: float | None) -> None:
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {v}", name)


def _json_type(v: Any) -> str:
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object", int: "an integer",
            float: "a number"}.get(type(v), type(v).__name__)
