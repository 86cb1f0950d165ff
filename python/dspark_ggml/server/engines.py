"""Per-request engine settings: the engines that share the server's target and draft contexts.

The C engine's speculative parameters (n_max, p_min, draft or not) and its end-of-generation
tokens are per engine, so a request that overrides them (``speculative``, ``ignore_eos``) runs in
another engine over the same two contexts (same KV caches, same sequence ids: a slot belongs to one
engine at a time). Each engine steps its own sequences, so sequences with different settings share
the machine, not a verify batch. Greedy output does not depend on the speculative setting: it
changes speed only.

Override engines are counted: each running sequence holds its engine, and an engine is freed when
the last sequence holding it leaves (creating one is cheap: small host buffers). At most
``MAX_ENGINES`` distinct settings run at once; a sequence asking for another one meanwhile is
refused with :class:`TooManySettingsError` (the server answers 503: retry later). The target-only
engine (``speculative: false``) is kept for the server's life: creating it turns the shared target
context's feature capture off and on again, which re-reserves its compute buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..engine import Engine
from ..errors import DSparkError, InvalidArgumentError

if TYPE_CHECKING:
    from ..llm import LLM

MAX_ENGINES = 8  # distinct override settings running at once; each holds only small host buffers


class TooManySettingsError(DSparkError):
    """Every one of the MAX_ENGINES override engines runs a sequence: a new setting must wait."""


@dataclass(frozen=True)
class SpecOverride:
    """A request's engine setting: ``off`` (target only), or n_max / p_min (None = the server's);
    ``ignore_eos``: end-of-generation tokens do not end the sequence."""

    off: bool = False
    n_max: int | None = None
    p_min: float | None = None
    ignore_eos: bool = False


class EnginePool:
    """The server's engine plus one per override setting in use; used from the engine loop thread only.

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
        self._users: dict[int, int] = {}  # id(engine) -> sequences holding it
        self._keys: dict[int, SpecOverride] = {}

    def acquire(self, override: SpecOverride | None) -> Engine:
        """The engine for a setting (created on first use), held until :meth:`release`.

        Raises:
            InvalidArgumentError: a setting the draft cannot take (e.g. p_min without a confidence
                head, n_max above the verify block the context was sized for).
            TooManySettingsError: MAX_ENGINES other settings are running.
        """
        key = self._normalise(override)
        if key is None:
            return self.default
        engine = self._engines.get(key)
        if engine is None:
            if self._n_counted() >= MAX_ENGINES and not self._permanent(key):
                raise TooManySettingsError(f"{MAX_ENGINES} other speculative / ignore_eos settings are "
                                           "running (the most at once): retry when one has finished")
            engine = self._engines[key] = self._make(key)
            self._keys[id(engine)] = key
        self._users[id(engine)] = self._users.get(id(engine), 0) + 1
        return engine

    def release(self, engine: Engine) -> None:
        """A sequence no longer holds ``engine``; the last one frees it (the default and the
        target-only engine stay)."""
        if engine is self.default:
            return
        n = self._users.get(id(engine), 0) - 1
        if n > 0:
            self._users[id(engine)] = n
            return
        self._users.pop(id(engine), None)
        key = self._keys.get(id(engine))
        if key is not None and not self._permanent(key):
            del self._keys[id(engine)]
            del self._engines[key]
            engine.close()

    def engines(self) -> list[Engine]:
        """The default engine and the override engines alive now."""
        return [self.default, *self._engines.values()]

    def close(self) -> None:
        """Free the override engines (the LLM frees its own)."""
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        self._users.clear()
        self._keys.clear()

    # ---- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _permanent(key: SpecOverride) -> bool:
        return key == SpecOverride(off=True)

    def _n_counted(self) -> int:
        return sum(1 for key in self._engines if not self._permanent(key))

    def _normalise(self, override: SpecOverride | None) -> SpecOverride | None:
        """None where the default engine already runs the setting (or nothing could differ)."""
        if override is None:
            return None
        s = self._llm.speculative
        eos = override.ignore_eos
        if self._llm.draft_context is None:
            # without a draft every setting is target-only decoding; only ignore_eos differs
            return SpecOverride(off=True, ignore_eos=True) if eos else None
        if override.off:
            return SpecOverride(off=True, ignore_eos=eos)
        n_max = self._clamped(s.n_max if override.n_max is None else override.n_max)
        p_min = s.p_min if override.p_min is None else override.p_min
        same = (n_max, p_min) == (self._clamped(s.n_max), s.p_min)
        if same and not eos:
            return None
        if not same and s.schedule == "confidence":
            # that schedule calibrates on an empty cache when its engine is created: not while serving
            raise InvalidArgumentError("per-request n_max / p_min need the server's static or adaptive "
                                       "schedule (it runs --spec-schedule confidence); 'off' works")
        return SpecOverride(n_max=n_max, p_min=p_min, ignore_eos=eos)

    def _clamped(self, n_max: int) -> int:
        """n_max as the engine runs it: 0 and anything above the draft's maximum mean the maximum."""
        assert self._llm.draft_model is not None
        full = self._llm.draft_model.info.max_draft
        return full if n_max <= 0 or n_max > full else n_max

    def _make(self, key: SpecOverride) -> Engine:
        llm, s = self._llm, self._llm.speculative
        eog = [] if key.ignore_eos else (sorted(llm.tokenizer.eog_ids) if llm.tokenizer is not None else [])
        if key.off:
            engine = Engine(llm.context, None, eog=eog)
            # a draftless engine turns feature capture off in the shared target context: turn it
            # back on for the engines that draft
            if llm.draft_model is not None:
                llm.context.set_capture_layers(llm.draft_model.info.target_layers)
            return engine
        # a request's n_max is a fixed block: the static schedule (the adaptive one would also have
        # to calibrate on empty contexts, and it chooses the length itself)
        return Engine(llm.context, llm.draft_context, n_max=key.n_max or 0, n_min=s.n_min,
                      p_min=key.p_min or 0.0, draft_mode=s.draft_mode, schedule="static",
                      backend_sampling=s.backend_sampling,
                      markov_top_k=s.markov_top_k, eog=eog)


def with_ignore_eos(override: SpecOverride | None, ignore_eos: bool) -> SpecOverride | None:
    """``override`` with ignore_eos set (a request's two engine fields in one key)."""
    if not ignore_eos:
        return override
    return replace(override or SpecOverride(), ignore_eos=True)
