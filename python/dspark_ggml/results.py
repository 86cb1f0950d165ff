"""What generation returns: the whole result, the streamed chunks, and their statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .engine import SpecStats
from .logprobs import TokenLogprob

# Why a sequence ended:
#   "stop"         an end-of-generation token, a stop token (stop_token_ids) or a stop string
#   "length"       max_tokens reached
#   "context_full" no room left in the context (n_ctx)
#   "aborted"      LLM.abort() was called
FINISH_REASONS = ("stop", "length", "context_full", "aborted")

# engine sequence status -> finish reason
ENGINE_FINISH = {"eog": "stop", "stop": "stop", "length": "length", "context_full": "context_full"}


@dataclass
class GenerationStats(SpecStats):
    """Speculative decoding counters of one request plus its wall-clock times (milliseconds).

    Counts are the engine's: tokens it committed after a stop string was found (in the same step)
    are included in n_generated.
    """

    t_decode_ms: float = 0.0  # wall time after the prefill until the request finished
    t_total_ms: float = 0.0   # wall time of the whole request, prefill included

    @property
    def tokens_per_second(self) -> float:
        """Decoding speed: tokens emitted by verify steps (all but the prefill's) per second."""
        n = self.n_generated - 1
        return n * 1000.0 / self.t_decode_ms if n > 0 and self.t_decode_ms > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.n_prompt * 1000.0 / self.t_prefill_ms if self.t_prefill_ms > 0 else 0.0

    @classmethod
    def from_spec(cls, spec: SpecStats, *, t_decode_ms: float, t_total_ms: float) -> GenerationStats:
        values = {name: getattr(spec, name) for name in SpecStats.__dataclass_fields__}
        return cls(**values, t_decode_ms=t_decode_ms, t_total_ms=t_total_ms)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.update(tokens_per_second=self.tokens_per_second,
                 prompt_tokens_per_second=self.prompt_tokens_per_second)
        return d


@dataclass
class GenerationChunk:
    """A piece of a streamed generation: what one engine step (or the prefill) added.

    Attributes:
        text: new text, safe to show: never part of a stop string, never half a UTF-8 character.
            May be "" while text is held back.
        tokens: the new token ids (cut after the token that completed a stop string).
        from_draft: per token, whether it was a draft token the target accepted.
        index: which prompt of a batch this belongs to (0 for a single prompt).
        finish_reason: None while the sequence goes on; on its last chunk one of "stop",
            "length", "context_full", "aborted".
        stats: on the last chunk, the request's statistics; else None.
        logprobs: with ``SamplingParams(logprobs=k)``, one entry per token; else None.
        prompt_logprobs: on the first chunk of a request with ``prompt_logprobs``, one entry per
            prompt token (None for the first); else None.
        ended_by_token: the last token is the end-of-generation or stop token that ended the
            sequence: it is in ``tokens`` (and ``logprobs``) but not in the text.
    """

    text: str
    tokens: list[int]
    from_draft: list[bool]
    index: int = 0
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    ended_by_token: bool = False


@dataclass
class GenerationResult:
    """A finished generation.

    Attributes:
        text: the generated text. It ends before whatever stopped generation: a stop string, a
            stop token or an end-of-generation token is never part of it.
        tokens: the generated token ids, including an end-of-generation or stop token that ended
            it (but nothing after the token that completed a stop string).
        finish_reason: "stop", "length", "context_full" or "aborted".
        stats: counters and timings (see GenerationStats).
        prompt_tokens: the prompt's token ids.
        from_draft: per token, whether it came from the draft.
        logprobs: with ``SamplingParams(logprobs=k)``, one :class:`TokenLogprob` per token of
            ``tokens``; else None.
        prompt_logprobs: with ``SamplingParams(prompt_logprobs=k)``, one entry per prompt token
            (None for the first); else None.
    """

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the shape `dspark-ggml generate --json` prints)."""
        d = {"text": self.text, "tokens": list(self.tokens), "finish_reason": self.finish_reason,
             "prompt_tokens": list(self.prompt_tokens), "from_draft": list(self.from_draft),
             "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            d["logprobs"] = [e.to_dict() for e in self.logprobs]
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = [e.to_dict() if e is not None else None for e in self.prompt_logprobs]
        return d
