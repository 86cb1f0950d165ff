"""Request bodies of the OpenAI-compatible endpoints: parsed, type-checked, validated (else 400).

Fields a request leaves out (or sends as null) take the server's defaults (``dspark-ggml serve``'s
sampling flags). Fields of OpenAI's API that this server does not implement are refused when they
ask for something (``logprobs: true``, a non-zero penalty, tools) rather than silently ignored;
other unknown fields are ignored, as OpenAI-compatible servers do.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from ..sampling import SamplingParams
from .engines import SpecOverride
from .errors import bad_request

SEED_LIMIT = 2**32 - 1
MAX_STOPS = 16
ROLES = ("system", "developer", "user", "assistant", "tool")
# field -> the value that means "not used": anything else is refused as not implemented
_UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
                "suffix": (None, ""), "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0),
                "frequency_penalty": (None, 0, 0.0), "tools": (None, []), "functions": (None, []),
                "tool_choice": (None, "none", "auto"), "response_format": (None, {"type": "text"})}


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    endpoint: str                         # "completions" or "chat.completions"
    prompt: str | list[int] | None        # completions
    messages: list[dict[str, Any]] | None  # chat
    sampling: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    speculative: SpecOverride | None


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
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad_request(f"'{name}' must be an integer, got {_json_type(v)}", name)
        _check_range(name, v, lo, hi)
        return v

    def number(self, name: str, default: Any, lo: float | None = None, hi: float | None = None) -> Any:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
            raise bad_request(f"'{name}' must be a number, got {_json_type(v)}", name)
        _check_range(name, v, lo, hi)
        return float(v)

    def boolean(self, name: str, default: bool) -> bool:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise bad_request(f"'{name}' must be true or false, got {_json_type(v)}", name)
        return v

    def string(self, name: str, default: Any) -> Any:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, str):
            raise bad_request(f"'{name}' must be a string, got {_json_type(v)}", name)
        return v


def parse_completion(body: Any, defaults: SamplingParams, n_slots: int) -> GenerationRequest:
    f = Fields(body)
    _refuse_unsupported(f)
    return _generation(f, "completions", _prompt(f), None, defaults, n_slots)


def parse_chat(body: Any, defaults: SamplingParams, n_slots: int) -> GenerationRequest:
    f = Fields(body)
    _refuse_unsupported(f)
    return _generation(f, "chat.completions", None, _messages(f), defaults, n_slots)


def parse_tokenize(body: Any) -> tuple[str, bool, bool]:
    """(content, add_special, parse_special) of POST /tokenize (llama-server's fields)."""
    f = Fields(body)
    content = f.string("content", None)
    if content is None:
        raise bad_request("'content' (the text to tokenize) is required", "content")
    return content, f.boolean("add_special", False), f.boolean("parse_special", True)


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    f = Fields(body)
    return _token_ids(f.body.get("tokens"), "tokens", n_vocab, allow_empty=True)


# ---- the pieces ---------------------------------------------------------------------------------

def _generation(f: Fields, endpoint: str, prompt: str | list[int] | None,
                messages: list[dict[str, Any]] | None, defaults: SamplingParams,
                n_slots: int) -> GenerationRequest:
    f.string("model", None)  # one model is served: any name is accepted, but it must be a string
    stream = f.boolean("stream", False)
    return GenerationRequest(endpoint, prompt, messages, _sampling(f, defaults, endpoint), _n(f, n_slots),
                             stream, _include_usage(f), _speculative(f))


def _sampling(f: Fields, d: SamplingParams, endpoint: str) -> SamplingParams:
    chat_max = endpoint == "chat.completions" and f.given("max_completion_tokens")
    max_name = "max_completion_tokens" if chat_max else "max_tokens"
    top_k = f.integer("top_k", d.top_k, lo=-1)
    return replace(d, max_tokens=f.integer(max_name, d.max_tokens, lo=1),
                   temperature=f.number("temperature", d.temperature, lo=0.0),
                   top_p=_top_p(f, d.top_p), top_k=max(top_k, 0),  # -1 = off, as in vLLM
                   min_p=f.number("min_p", d.min_p, lo=0.0, hi=1.0),
                   seed=f.integer("seed", d.seed, lo=0, hi=SEED_LIMIT - 1),
                   stop=_stops(f, d.stop), stop_token_ids=_stop_token_ids(f, d.stop_token_ids))


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
    """Whether a stream ends with a usage chunk: yes unless stream_options.include_usage is false."""
    v = f.body.get("stream_options")
    if v is None:
        return True
    if not isinstance(v, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    return Fields(v).boolean("include_usage", True)


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
    n_max, p_min = s.integer("n_max", None, lo=0), s.number("p_min", None, lo=0.0, hi=1.0)
    return SpecOverride(n_max=n_max, p_min=p_min) if (n_max, p_min) != (None, None) else None


def _prompt(f: Fields) -> str | list[int]:
    """A text or a list of token ids; a batch of one ([text] or [[ids]]) is unwrapped."""
    v = f.body.get("prompt")
    if v is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(isinstance(x, (str, list)) for x in v):
        raise bad_request("one prompt per request: send several requests (they are batched together)",
                          "prompt")
    return _token_ids(v, "prompt", None)


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


def check_prompt_tokens(tokens: list[int], n_vocab: int) -> None:
    _check_token_range(tokens, "prompt", n_vocab)


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
    for key in ("name", "reasoning_content"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
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


def _refuse_unsupported(f: Fields) -> None:
    for name, unused in _UNSUPPORTED.items():
        if name in f.body and not any(f.body[name] == u and type(f.body[name]) is type(u) for u in unused):
            raise bad_request(f"'{name}' is not supported by this server", name)
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
