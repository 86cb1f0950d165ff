"""Sampling parameters, and sampling rows of logits with the core's sampler chain."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, TypedDict, Union

import numpy as np

from . import _lib
from .errors import InvalidArgumentError
from .system import devices

MAX_TOP_LOGPROBS = 20  # DSPARK_MAX_TOP_LOGPROBS, OpenAI's limit


@dataclass
class SamplingParams:
    """How target tokens are chosen (names as in vLLM / OpenAI).

    Attributes:
        temperature: 0 (default) = greedy, reproducible and token-identical with and without a
            draft; > 0 samples. Must be finite (inf and NaN are refused).
        top_k: keep the k most likely tokens; 0 (default) = off.
        top_p: keep the smallest set whose probability mass reaches top_p; 1.0 (default) = off.
        min_p: drop tokens below min_p times the most likely one's probability; 0.0 (default) = off.
        seed: random seed; None (default) = a fresh random seed.
        max_tokens: tokens to generate at most; default 256; None = until end of generation or
            the context is full.
        stop_token_ids: extra tokens that end generation (the model's end-of-generation tokens
            always do).
        stop: strings that end generation; the text is cut before the first one (see
            ``LLM.generate``). Token ids go in stop_token_ids.
        logit_bias: {token id: bias} added to the logits before sampling (OpenAI's; a bias in
            [-100, 100], or -inf to ban the token). Ids must be in the vocabulary.
        presence_penalty: OpenAI's: subtracted from the logit of every token seen in the
            penalty window; in [-2, 2], default 0 (off).
        frequency_penalty: OpenAI's: subtracted once per occurrence in the window; in [-2, 2].
        repeat_penalty: llama.cpp's: a seen token's logit is divided by it (multiplied when <= 0);
            > 0, default 1.0 (off).
        penalty_last_n: the window of prompt + output tokens the penalties count (llama.cpp's
            ``repeat_last_n``); default 64, 0 = off, -1 = the whole context.
        logprobs: None (default) = off; k in 0..20: each generated token's logprob in the
            distribution it was drawn from (greedy: the softmax of the adjusted logits), plus the
            k most probable tokens. The same with and without a draft.
        prompt_logprobs: None = off; k in 0..20: the same for every prompt token after the first
            (under the model's plain softmax; disables prompt-cache reuse for the request).
        json_schema: constrain the output to JSON of this schema (a dict or its JSON text); the
            LLM builds the grammar with its tokenizer.
        grammar: constrain the output to this grammar (a Lark / llguidance grammar string).

    The penalties, the bias and a constraint change the logits every row of a verify step
    sees (each row counts the draft tokens before it), so output stays lossless with a draft.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256
    stop_token_ids: list[int] | None = None
    stop: list[str] | str | None = None
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: dict[str, Any] | str | None = None
    grammar: str | None = None

    def validate(self) -> None:
        """Raise InvalidArgumentError for a bad value, where the value enters (LLM.generate, the
        server's defaults, the command line): the sampler's values by the core's rules
        (dspark_sampling_check, which every C entry point taking them applies), max_tokens and the
        ranges the C struct cannot hold here."""
        _lib.check(_lib.lib().dspark_sampling_check(self.to_c()))
        self.check_request_fields()

    def check_request_fields(self) -> None:
        """The per-request fields the C request carries (dspark_request; the core checks them again
        with the vocabulary at add): the ranges that need no model."""
        bias = self.logit_bias or {}
        if not isinstance(bias, Mapping):
            raise InvalidArgumentError(f"logit_bias must map token ids to biases, got {type(bias).__name__}")
        for tok, b in bias.items():
            if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= int(tok) < 2**31:
                raise InvalidArgumentError(f"logit_bias: token id {tok!r} must be an integer >= 0")
            if not isinstance(b, (int, float, np.number)) or math.isnan(b) or b == math.inf:
                raise InvalidArgumentError(f"logit_bias: the bias of token {tok} must be a number or -inf, "
                                           f"got {b!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise InvalidArgumentError(f"{name} must be in [-2, 2], got {v!r}")
        if not isinstance(self.repeat_penalty, (int, float)) or not 0.0 <= self.repeat_penalty < math.inf:
            raise InvalidArgumentError(f"repeat_penalty must be > 0 (1 = off), got {self.repeat_penalty!r}")
        if isinstance(self.penalty_last_n, bool) or not isinstance(self.penalty_last_n, int) \
                or not -1 <= self.penalty_last_n < 2**31:
            raise InvalidArgumentError("penalty_last_n must be -1 (the context), 0 (off) or > 0, "
                                       f"got {self.penalty_last_n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            bad = isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TOP_LOGPROBS
            if v is not None and bad:
                raise InvalidArgumentError(f"{name} must be None or an integer in 0..{MAX_TOP_LOGPROBS}, "
                                           f"got {v!r}")
        if self.json_schema is not None and self.grammar is not None:
            raise InvalidArgumentError("json_schema and grammar are exclusive: give one")

    def request_fields(self, r: Any, keep: list[Any]) -> None:
        """Set the per-request fields of the C struct dspark_request ``r``; the cffi buffers they
        point to go to ``keep`` (they must live until the call)."""
        self.check_request_fields()
        ffi = _lib.ffi()
        bias = self.logit_bias or {}
        if bias:
            arr = ffi.new("struct dspark_logit_bias[]", len(bias))
            for i, (tok, b) in enumerate(bias.items()):
                arr[i].token, arr[i].bias = int(tok), float(b)
            keep.append(arr)
            r.logit_bias, r.n_logit_bias = arr, len(bias)
        r.presence_penalty, r.frequency_penalty = self.presence_penalty, self.frequency_penalty
        r.repeat_penalty, r.penalty_last_n = self.repeat_penalty, self.penalty_last_n
        r.logprobs = self.logprobs is not None
        r.top_logprobs = max(self.logprobs or 0, self.prompt_logprobs or 0)
        r.prompt_logprobs = self.prompt_logprobs is not None

    def to_c(self) -> Any:
        """The C struct dspark_sampling_params, its values unchecked: the C function it is passed to
        checks them. max_tokens and the seed's and top_k's ranges are checked here."""
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < _lib.lib().DSPARK_DEFAULT_SEED:
            raise InvalidArgumentError(f"seed must be in [0, 2**32-1), got {self.seed}")
        if not isinstance(self.top_k, int) or not -2**31 <= self.top_k < 2**31:
            raise InvalidArgumentError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        lib, ffi = _lib.lib(), _lib.ffi()
        p = ffi.new("struct dspark_sampling_params *", lib.dspark_sampling_default_params())
        p.temperature, p.top_k, p.top_p, p.min_p = self.temperature, self.top_k, self.top_p, self.min_p
        p.seed = lib.DSPARK_DEFAULT_SEED if self.seed is None else self.seed
        return p


class SamplingOptions(TypedDict, total=False):
    """SamplingParams fields given as keywords (``llm.generate(prompt, max_tokens=64)``)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: Optional[int]
    max_tokens: Optional[int]
    stop_token_ids: Optional[List[int]]
    stop: Union[List[str], str, None]
    logit_bias: Optional[Dict[int, float]]
    presence_penalty: float
    frequency_penalty: float
    repeat_penalty: float
    penalty_last_n: int
    logprobs: Optional[int]
    prompt_logprobs: Optional[int]
    json_schema: Union[Dict[str, Any], str, None]
    grammar: Optional[str]


def with_options(params: SamplingParams | None, options: Mapping[str, Any]) -> SamplingParams:
    """``params`` (default: SamplingParams()) with the fields in ``options`` replaced; validated.

    Raises:
        TypeError: an option that is not a SamplingParams field.
        InvalidArgumentError: a bad value.
    """
    known = {f.name for f in fields(SamplingParams)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown sampling option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    merged = replace(params or SamplingParams(), **options)
    merged.validate()
    return merged


def sample_rows(logits: np.ndarray, uniforms: np.ndarray, params: SamplingParams | Sequence[SamplingParams], *,
                in_graph: bool = False, device: int | None = None, adjust: np.ndarray | None = None,
                return_probs: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Sample each row of ``logits`` [n, V] with one uniform draw per row.

    Args:
        params: one SamplingParams for every row, or one per row.
        in_graph: run the sampler as a ggml graph (the backend sampler) instead of on the host;
            the two run the same chain and pick the same tokens (up to float rounding at a
            boundary between two tokens' cumulative probabilities).
        device: the device index (``system.devices()``) the graph runs on; implies in_graph.
            Default: the CPU.
        adjust: [n, V] added to the logits first (a logit bias; -inf bans a token).
        return_probs: also return each token's probability under the distribution it was drawn
            from (1 for greedy rows).
    """
    x = np.ascontiguousarray(logits, dtype=np.float32)
    if x.ndim != 2:
        raise InvalidArgumentError("logits must be [rows, vocab]")
    u = np.ascontiguousarray(uniforms, dtype=np.float32).reshape(-1)
    if len(u) != x.shape[0]:
        raise InvalidArgumentError("one uniform per row")
    out = np.empty(x.shape[0], dtype=np.int32)
    lib, ffi = _lib.lib(), _lib.ffi()
    if isinstance(params, SamplingParams) and device is None and adjust is None and not return_probs:
        _lib.check(lib.dspark_sample_rows(ffi.from_buffer("float[]", x), x.shape[0], x.shape[1],
                                          ffi.from_buffer("float[]", u), params.to_c(), in_graph,
                                          ffi.from_buffer("int32_t[]", out)))
        return out
    each = [params] * x.shape[0] if isinstance(params, SamplingParams) else list(params)
    if len(each) != x.shape[0]:
        raise InvalidArgumentError(f"{len(each)} sampling params for {x.shape[0]} rows")
    c_params = ffi.new("struct dspark_sampling_params[]", len(each))
    for i, sp in enumerate(each):
        c_params[i] = sp.to_c()[0]
    adj = ffi.NULL
    if adjust is not None:
        a = np.ascontiguousarray(adjust, dtype=np.float32)
        if a.shape != x.shape:
            raise InvalidArgumentError(f"adjust must have the logits' shape {x.shape}, got {a.shape}")
        adj = ffi.from_buffer("float[]", a)
    if device is None:
        device = next(d.index for d in devices() if d.type == "cpu") if in_graph else -1
    probs = np.empty(x.shape[0], dtype=np.float32)
    _lib.check(lib.dspark_sample_rows_each(ffi.from_buffer("float[]", x), x.shape[0], x.shape[1],
                                           ffi.from_buffer("float[]", u), c_params, adj, device,
                                           ffi.from_buffer("int32_t[]", out), ffi.from_buffer("float[]", probs)))
    return (out, probs) if return_probs else out
