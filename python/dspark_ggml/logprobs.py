"""Logprobs of tokens as the engine reports them (OpenAI's ``logprobs`` / ``top_logprobs``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprob:
    """One token's log probability in the distribution it was drawn from, and the most probable
    tokens of that distribution (descending, ties by id).

    For a greedy request the distribution is the softmax at temperature 1 of the adjusted logits
    (logit bias, penalties, constraint); for a sampled one the sampler's, after its filters and
    temperature. Prompt tokens use the model's plain softmax.
    """

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": [[t, lp] for t, lp in self.top]}


def read_logprobs(fn: Any, handle: Any, seq_id: int, tokens: list[int], k: int) -> list[TokenLogprob]:
    """The entries a dspark_engine_get_(prompt_)logprobs function reports for ``tokens``, with the
    top ``k`` of each (the C side may hold more, when logprobs and prompt_logprobs differ)."""
    from . import _lib

    ffi = _lib.ffi()
    lp, ids, tlp, top = (ffi.new("const float **"), ffi.new("const int32_t **"), ffi.new("const float **"),
                         ffi.new("int32_t *"))
    n = _lib.check(fn(handle, seq_id, lp, ids, tlp, top))
    if n != len(tokens):
        raise RuntimeError(f"{n} logprob entries for {len(tokens)} tokens")
    width, k = top[0], min(k, top[0])
    out = []
    for i in range(n):
        entries = [(int(ids[0][i * width + j]), float(tlp[0][i * width + j])) for j in range(k)]
        out.append(TokenLogprob(int(tokens[i]), float(lp[0][i]), [e for e in entries if e[0] >= 0]))
    return out
