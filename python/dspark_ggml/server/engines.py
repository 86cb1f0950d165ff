"""Per-request speculative settings: the engines that share the server's target and draft contexts.

The C engine's speculative parameters (n_max, p_min, draft or not) are per engine, so a request
that overrides them runs in another engine over the same two contexts (same KV caches, same
sequence ids: a slot belongs to one engine at a time). Each engine steps its own sequences, so
sequences with different settings share the machine, not a verify batch. Greedy output does not
depend on the setting: an override changes speed only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine import Engine
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..llm import LLM

MAX_ENGINES = 8  # distinct settings alive at once; each holds only small host buffers


@dataclass(frozen=True)
class SpecOverride:
    """A request's speculative setting: ``off`` (target only), or n_max / p_min (None = the server's)."""

    off: bool = False
    n_max: int | None = None
    p_min: float | None = None


class EnginePool:
    """The server's engine plus one per override seen; used from the engine loop thread only.

    Args:
        llm: the loaded LLM; its engine is the default one. Its Python abort callback is removed:
            ggml calls it for every graph node, and each call would take the GIL from the HTTP side
            while the step computes. The server never aborts a step; it removes sequences between
            steps instead.
    """

    def __init__(self, llm: LLM) -> None:
        self._llm = llm
        llm.engine.set_abort_callback(None)
        self.default = llm.engine
        self._engines: dict[SpecOverride, Engine] = {}

    def get(self, override: SpecOverride | None) -> Engine:
        """The engine for a setting (created on first use).

        Raises:
            InvalidArgumentError: a setting the draft cannot take (e.g. p_min without a confidence
                head, n_max above the verify block the context was sized for), or too many settings.
        """
        key = self._normalise(override)
        if key is None:
            return self.default
        engine = self._engines.get(key)
        if engine is None:
            if len(self._engines) >= MAX_ENGINES:
                raise InvalidArgumentError(f"too many distinct speculative settings in use "
                                           f"(at most {MAX_ENGINES})")
            engine = self._engines[key] = self._make(key)
        return engine

    def engines(self) -> list[Engine]:
        return [self.default, *self._engines.values()]

    def close(self) -> None:
        """Free the override engines (the LLM frees its own)."""
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()

    def _normalise(self, override: SpecOverride | None) -> SpecOverride | None:
        """None where the default engine already runs the setting (or nothing could differ)."""
        s = self._llm.speculative
        if override is None or self._llm.draft_context is None:
            return None  # without a draft every setting is target-only decoding
        if override.off:
            return SpecOverride(off=True)
        n_max = self._clamped(s.n_max if override.n_max is None else override.n_max)
        p_min = s.p_min if override.p_min is None else override.p_min
        if (n_max, p_min) == (self._clamped(s.n_max), s.p_min):
            return None
        if s.schedule == "confidence":
            # that schedule calibrates on an empty cache when its engine is created: not while serving
            raise InvalidArgumentError("per-request n_max / p_min need the server's static or adaptive "
                                       "schedule (it runs --spec-schedule confidence); 'off' works")
        return SpecOverride(n_max=n_max, p_min=p_min)

    def _clamped(self, n_max: int) -> int:
        """n_max as the engine runs it: 0 and anything above the draft's maximum mean the maximum."""
        assert self._llm.draft_model is not None
        full = self._llm.draft_model.info.max_draft
        return full if n_max <= 0 or n_max > full else n_max

    def _make(self, key: SpecOverride) -> Engine:
        llm, s = self._llm, self._llm.speculative
        eog = sorted(llm.tokenizer.eog_ids) if llm.tokenizer is not None else []
        if key.off:
            engine = Engine(llm.context, None, eog=eog)
            # a draftless engine turns feature capture off in the shared target context: turn it
            # back on for the engines that draft
            assert llm.draft_model is not None
            llm.context.set_capture_layers(llm.draft_model.info.target_layers)
            return engine
        # a request's n_max is a fixed block: the static schedule (the adaptive one would also have
        # to calibrate on empty contexts, and it chooses the length itself)
        return Engine(llm.context, llm.draft_context, n_max=key.n_max or 0, n_min=s.n_min,
                      p_min=key.p_min or 0.0, draft_mode=s.draft_mode, schedule="static",
                      backend_sampling=s.backend_sampling,
                      markov_top_k=s.markov_top_k, eog=eog)
