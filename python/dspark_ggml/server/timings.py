"""llama-server's ``timings`` object: prompt and generation counts, times and rates of a request.

Every number comes from the engine's counters and the scheduler's clock (``GenerationStats``):
nothing is timed a second time here. The fields mean what llama-server's do:

* ``prompt_n`` / ``prompt_ms``: prompt tokens prefilled (those the prompt cache served are
  ``cache_n``) and the prefill's time;
* ``predicted_n`` / ``predicted_ms``: tokens generated (usage's completion_tokens) and the time
  from the end of the prefill to the last one. The first token comes with the prefill's logits, so
  the generation rates count ``predicted_n - 1`` tokens, as llama-server's do;
* ``draft_n`` / ``draft_n_accepted``: draft tokens sent to verification and accepted, only when
  the request drafted.

A rate or per-token time whose divisor is 0 is 0.0, as in llama-server.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from .responses import Choice


def timings(choices: Iterable[Choice]) -> dict[str, Any] | None:
    """The timings of the finished ``choices``, counts and times summed (one choice: its own);
    None when none has statistics (llama-server leaves the field out when a slot never ran)."""
    prompt_n = cache_n = predicted_n = steps = draft_n = accepted = 0
    prompt_ms = predicted_ms = 0.0
    counted = False
    for c in choices:
        s = c.stats
        if s is None:
            continue
        counted = True
        n = len(c.tokens)
        cache_n += s.n_cached
        prompt_n += s.n_prompt - s.n_cached
        prompt_ms += s.t_prefill_ms
        predicted_n += n
        steps += max(n - 1, 0)
        predicted_ms += getattr(s, "t_decode_ms", 0.0)  # GenerationStats; a bare SpecStats has no clock
        draft_n += s.n_drafted
        accepted += s.n_accepted
    if not counted:
        return None
    out: dict[str, Any] = {
        "cache_n": cache_n,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 * steps / predicted_ms if predicted_ms > 0 else 0.0,
    }
    if draft_n > 0:
        out.update(draft_n=draft_n, draft_n_accepted=accepted)
    return out
