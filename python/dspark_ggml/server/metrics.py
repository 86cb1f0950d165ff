"""Server counters in Prometheus' text format (GET /metrics).

Token and speculative counters grow when a sequence leaves the engine (finished or cancelled), from
the engine's own per-sequence statistics; queue depth and busy slots are read live. Names follow
Prometheus' conventions: counters end in ``_total``, gauges do not, a ratio ends in ``_ratio``.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..engine import SpecStats

PREFIX = "dspark"
_TOKEN_COUNTERS = (("prompt", "prompt_tokens_total", "prompt tokens (the cached ones included)"),
                   ("cached", "prompt_tokens_cached_total",
                    "prompt tokens the prompt cache served: reused KV cells, not prefilled"),
                   ("generated", "generated_tokens_total", "tokens generated"),
                   ("drafted", "drafted_tokens_total", "draft tokens sent to verification"),
                   ("accepted", "accepted_tokens_total", "draft tokens the target accepted"),
                   ("steps", "verify_steps_total", "verify steps, summed over sequences"),
                   ("embedded", "embedding_tokens_total", "input tokens of /v1/embeddings"))


class Metrics:
    """Thread-safe counters; :meth:`render` writes them with the live gauges."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()   # by endpoint
        self._responses: Counter[int] = Counter()  # by HTTP status of the answers we chose
        self._finished: Counter[str] = Counter()   # sequences, by reason
        self._tokens = Counter(prompt=0, cached=0, generated=0, drafted=0, accepted=0, steps=0, embedded=0)

    # ---- recording (any thread) -------------------------------------------------------------------

    def record_request(self, endpoint: str) -> None:
        with self._lock:
            self._requests[endpoint] += 1

    def record_response(self, status: int) -> None:
        with self._lock:
            self._responses[status] += 1

    def record_finish(self, reason: str) -> None:
        with self._lock:
            self._finished[reason] += 1

    def record_sequence(self, stats: SpecStats) -> None:
        with self._lock:
            self._tokens.update(prompt=stats.n_prompt, cached=stats.n_cached, generated=stats.n_generated,
                                drafted=stats.n_drafted,
                                accepted=stats.n_accepted, steps=stats.n_steps)

    def record_embedding(self, n_tokens: int) -> None:
        with self._lock:
            self._tokens.update(embedded=n_tokens)

    # ---- reading ----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._tokens)

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        """The Prometheus exposition; ``gauges``: name -> (help, read function), read now."""
        with self._lock:
            t = dict(self._tokens)
            lines = _family("requests_total", "counter", "generation and embedding requests, by endpoint",
                            [({"endpoint": k}, v) for k, v in sorted(self._requests.items())])
            lines += _family("responses_total", "counter", "answers by HTTP status (generation, errors)",
                             [({"status": str(k)}, v) for k, v in sorted(self._responses.items())])
            lines += _family("sequences_finished_total", "counter",
                             "sequences (one per choice) that left the engine, by reason",
                             [({"reason": k}, v) for k, v in sorted(self._finished.items())])
        for key, name, help_text in _TOKEN_COUNTERS:
            lines += _family(name, "counter", help_text, [({}, t[key])])
        rate = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
        tau = (t["accepted"] + t["steps"]) / t["steps"] if t["steps"] else 0.0
        lines += _family("draft_acceptance_ratio", "gauge", "accepted / drafted tokens so far", [({}, rate)])
        lines += _family("tokens_per_verify_step", "gauge",
                         "tau: mean tokens per verify step so far, the target's own included", [({}, tau)])
        for name, (help_text, read) in gauges.items():
            lines += _family(name, "gauge", help_text, [({}, read())])
        return "\n".join(lines) + "\n"


def _family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> list[str]:
    full = f"{PREFIX}_{name}"
    lines = [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{full}{{{label_text}}} {_number(value)}" if label_text else f"{full} {_number(value)}")
    return lines


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
