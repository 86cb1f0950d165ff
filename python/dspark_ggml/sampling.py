"""Sampling parameters, and sampling rows of logits with the core's sampler chain."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, List, Mapping, Optional, TypedDict, Union

import numpy as np

from . import _lib
from .errors import InvalidArgumentError



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
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256
    stop_token_ids: list[int] | None = None
    stop: list[str] | str | None = None

    def validate(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            # inf would be a uniform draw in name only (0 * inf logits): refused, as NaN
            raise InvalidArgumentError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgumentError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**32 - 1:
            raise InvalidArgumentError(f"seed must be in [0, 2**32-1), got {self.seed}")

    def to_c(self) -> Any:
        self.validate()
        lib, ffi = _lib.lib(), _lib.ffi()
        p = ffi.new("struct dspark_sampling_params *", lib.dspark_sampling_default_params())
        p.temperature, p.top_k, p.top_p, p.min_p = self.temperature, self.top_k, self.top_p, self.min_p
        p.seed = _lib.lib().DSPARK_DEFAULT_SEED if self.seed is None else self.seed
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


def sample_rows(logits: np.ndarray, uniforms: np.ndarray, params: SamplingParams, *, in_graph: bool = False) -> np.ndarray:
    """Sample each row of ``logits`` [n, V] with one uniform draw per row.

    ``in_graph`` runs the sampler as a ggml graph (the backend sampler) instead of on the host; the
    two pick the same tokens.
    """
    x = np.ascontiguousarray(logits, dtype=np.float32)
    if x.ndim != 2:
        raise InvalidArgumentError("logits must be [rows, vocab]")
    u = np.ascontiguousarray(uniforms, dtype=np.float32).reshape(-1)
    if len(u) != x.shape[0]:
        raise InvalidArgumentError("one uniform per row")
    out = np.empty(x.shape[0], dtype=np.int32)
    ffi = _lib.ffi()
    _lib.check(_lib.lib().dspark_sample_rows(ffi.from_buffer("float[]", x), x.shape[0], x.shape[1],
                                             ffi.from_buffer("float[]", u), params.to_c(), in_graph,
                                             ffi.from_buffer("int32_t[]", out)))
    return out
