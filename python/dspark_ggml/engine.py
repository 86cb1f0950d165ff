"""The speculative decoding engine (C++), driven step by step from Python."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from . import _lib
from ._handle import NativeHandle
from .context import Context
from .draft import DraftContext, DraftModel
from .constraint import ConstraintBinding
from .errors import ConstraintError, InvalidArgumentError
from .logprobs import TokenLogprob, read_logprobs
from .model import Model
from .sampling import SamplingParams


def draft_modes() -> dict[str, int]:
    """Drafting mode names (enum dspark_draft_mode values, from the header)."""
    return _lib.enum("DRAFT", greedy_chain="greedy")


def schedules() -> dict[str, int]:
    """Verify schedule names (enum dspark_verify_schedule values)."""
    return _lib.enum("SCHEDULE")


def seq_status_names() -> dict[int, str]:
    """enum dspark_seq_status values and their names (vLLM's finish reasons where they exist)."""
    return {v: k for k, v in _lib.enum("SEQ", max_tokens="length", ctx_full="context_full").items()}


@dataclass
class SpecStats:
    """Speculative decoding counters (of one sequence or all); times in milliseconds."""

    n_prompt: int = 0
    n_generated: int = 0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    t_prefill_ms: float = 0.0
    t_draft_ms: float = 0.0
    t_verify_ms: float = 0.0
    t_host_ms: float = 0.0
    n_cached: int = 0  # prompt tokens reused from the prompt cache (not prefilled)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """τ: tokens emitted per verify step, the target's own token included (DSpark paper)."""
        return (self.n_accepted + self.n_steps) / self.n_steps if self.n_steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Per draft position: accepted / drafted there."""
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at) if d]

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 acceptance_by_position=self.acceptance_by_position)
        return d


class Engine(NativeHandle):
    """Speculative decoding over a target context and an optional draft context.

    Args:
        target: the target :class:`~dspark_ggml.context.Context`.
        draft: a :class:`~dspark_ggml.draft.DraftContext`, or None for target-only decoding.
        n_max: draft tokens per step; 0 (default) = the draft's maximum (clamped to it).
        n_min: draft nothing when fewer would be verified. Default 0.
        p_min: DSpark: cut a block at the first position whose confidence is below p_min. Default 0.
        draft_mode: "greedy" (argmax chain, accept by matching the target's samples; default) or
            "probabilistic" (sampled chain, rejection sampling min(1, p/q)).
        schedule: "static" (default), "adaptive" (a block length per step from measured costs and
            running acceptance) or "confidence" (adaptive, then DSpark's prefix scheduler).
        backend_sampling: where the verify rows are sampled: True = inside the target's graph,
            False = on the host, "auto" (default) = in the graph for batches whose sequences are
            all greedy (faster there), on the host otherwise.
        eog: end-of-generation token ids.
        markov_top_k: DSpark, argmax drafting: add the Markov bias to each slot's top-k base
            candidates only (0, the default, is exact).
    """

    _free_function = "dspark_engine_free"
    _kind = "engine"

    def __init__(self, target: Context, draft: DraftContext | None = None, *, n_max: int = 0, n_min: int = 0,
                 p_min: float = 0.0, draft_mode: str = "greedy", schedule: str = "static",
                 backend_sampling: bool | str = "auto", eog: Sequence[int] = (), markov_top_k: int = 0) -> None:
        lib, ffi = _lib.lib(), _lib.ffi()
        p = spec_params(n_max=n_max, n_min=n_min, p_min=p_min, draft_mode=draft_mode, schedule=schedule,
                        backend_sampling=backend_sampling, markov_top_k=markov_top_k)
        self.target, self.draft = target, draft
        self._handle: Any = _lib.check_ptr(lib.dspark_engine_init(target.handle, draft.handle if draft else ffi.NULL, p))
        self._abort_cb: Any = None
        self._params: dict[int, SamplingParams] = {}  # each sequence's request (for its logprobs)
        self._constraints: dict[int, ConstraintBinding] = {}  # callbacks the C engine may call
        self.set_eog(eog)

    @property
    def n_draft(self) -> int:
        """Draft tokens per step (n_max after clamping; 0 without a draft)."""
        return int(_lib.lib().dspark_engine_n_draft(self.handle))

    def set_eog(self, ids: Sequence[int]) -> None:
        a = np.ascontiguousarray(list(ids), dtype=np.int32)
        _lib.check(_lib.lib().dspark_engine_set_eog(self.handle, _lib.ffi().from_buffer("int32_t[]", a), len(a)))

    def add(self, seq_id: int, prompt: Sequence[int] | np.ndarray, sampling: SamplingParams | None = None,
            stop_sequences: Sequence[Sequence[int]] = (), *, reuse_prefix: bool = False,
            constraint: Any | None = None) -> list[int]:
        """Start a sequence: prefill the prompt and return its first token(s). ``reuse_prefix``
        (prompt caching): keep the cells ``seq_id`` holds of the prompt's longest prefix
        (:meth:`cached_prefix`) and prefill only the rest; the output is the same either way
        (a request with prompt_logprobs prefills all of it).

        The sampling params' per-request fields (logit_bias, the penalties, logprobs,
        prompt_logprobs) go with the request; :meth:`new_logprobs` and :meth:`prompt_logprobs`
        read the logprobs. ``constraint``: an object with ``fill_masks(tokens, out) -> int`` and
        ``commit(tokens)`` (see :mod:`dspark_ggml.constraint`) that masks the target's rows and
        cuts drafts the grammar rejects; kept alive until the sequence is removed, detached or
        replaced. An exception in it fails the call with ConstraintError (from that exception).
        json_schema / grammar are the LLM's to turn into a constraint; the engine ignores them."""
        sp = sampling or SamplingParams()
        lib, ffi = _lib.lib(), _lib.ffi()
        prompt_a = np.ascontiguousarray(prompt, dtype=np.int32).reshape(-1)
        stops = [list(s) for s in stop_sequences]
        flat = np.ascontiguousarray([t for s in stops for t in s], dtype=np.int32)
        lens = np.ascontiguousarray([len(s) for s in stops], dtype=np.int32)
        r = ffi.new("struct dspark_request *")
        r.prompt = ffi.from_buffer("int32_t[]", prompt_a)
        r.n_prompt = len(prompt_a)
        c_sp = sp.to_c()  # checked by dspark_engine_add
        r.sampling = c_sp
        r.max_tokens = sp.max_tokens or 0
        r.stop_tokens = ffi.from_buffer("int32_t[]", flat) if len(flat) else ffi.NULL
        r.stop_lens = ffi.from_buffer("int32_t[]", lens) if len(lens) else ffi.NULL
        r.n_stop = len(stops)
        r.reuse_prefix = bool(reuse_prefix) and sp.prompt_logprobs is None
        keep: list[Any] = []
        sp.request_fields(r, keep)
        binding = ConstraintBinding(constraint) if constraint is not None else None
        if binding is not None:
            r.constraint = binding.c
        # the new callbacks must be findable while add runs (a failure in them); the old ones go
        # once the new request replaced the old sequence
        old = self._constraints.pop(seq_id, None), self._params.get(seq_id)
        if binding is not None:
            self._constraints[seq_id] = binding
        try:
            self._checked(lib.dspark_engine_add(self.handle, seq_id, r))
        except BaseException:
            self._constraints.pop(seq_id, None)
            if old[0] is not None:  # a refused request leaves the old sequence as it was
                self._constraints[seq_id] = old[0]
            raise
        self._params[seq_id] = sp
        return self.new_tokens(seq_id)[0]

    def _checked(self, status: int) -> int:
        """_lib.check, but a failure a constraint callback caused raises ConstraintError from the
        callback's exception. (No exception is bound in this frame while one propagates: a
        frame <-> exception cycle would hand the engine and its contexts to the cycle collector,
        which may free a context before the engine.)"""
        if status >= 0:
            return status
        failed = [(seq_id, b.take_error()) for seq_id, b in self._constraints.items()]
        cause = next(((seq_id, c) for seq_id, c in failed if c is not None), None)
        if cause is None:
            return _lib.check(status)
        message = f"the constraint of sequence {cause[0]} failed: {cause[1]!r} ({_lib.last_error()})"
        error = ConstraintError(message)
        error.seq_id = cause[0]
        raise error from cause[1]

    def cached_prefix(self, seq_id: int, prompt: Sequence[int] | np.ndarray) -> int:
        """How many leading tokens of ``prompt`` the cells of ``seq_id`` hold in both caches (what
        :meth:`add` with reuse_prefix keeps); at most len(prompt) - 1."""
        a = np.ascontiguousarray(prompt, dtype=np.int32).reshape(-1)
        ffi = _lib.ffi()
        buf = ffi.from_buffer("int32_t[]", a) if len(a) else ffi.NULL
        return _lib.check(_lib.lib().dspark_engine_cached_prefix(self.handle, seq_id, buf, len(a)))

    def step(self) -> int:
        """One speculative step for every active sequence; returns how many are still active."""
        return self._checked(_lib.lib().dspark_engine_step(self.handle))

    def run(self, max_steps: int) -> int:
        """Up to ``max_steps`` steps in one call (no return to Python in between), ending early after
        a step in which a sequence finished, when none is active, or while a stop is requested.
        The tokens of all of them accumulate for :meth:`new_tokens`. Returns the steps run; when a
        step fails it raises, and the tokens of the steps before it can still be read."""
        return self._checked(_lib.lib().dspark_engine_run(self.handle, max_steps))

    def new_tokens(self, seq_id: int) -> tuple[list[int], list[bool]]:
        """Tokens the last add/step/run committed for a sequence, and which came from the draft."""
        ffi = _lib.ffi()
        tp, fp = ffi.new("const int32_t **"), ffi.new("const uint8_t **")
        n = _lib.check(_lib.lib().dspark_engine_get_tokens(self.handle, seq_id, tp, fp))
        return [tp[0][i] for i in range(n)], [bool(fp[0][i]) for i in range(n)]

    def new_logprobs(self, seq_id: int) -> list[TokenLogprob]:
        """The logprobs of :meth:`new_tokens` (a request with ``logprobs``; else []), each with
        the request's ``logprobs`` top entries."""
        sp = self._params.get(seq_id)
        if sp is None or sp.logprobs is None:
            return []
        tokens = self.new_tokens(seq_id)[0]
        return read_logprobs(_lib.lib().dspark_engine_get_logprobs, self.handle, seq_id, tokens, sp.logprobs)

    def prompt_logprobs(self, seq_id: int, prompt: Sequence[int]) -> list[TokenLogprob | None]:
        """The prompt's logprobs (a request with ``prompt_logprobs``; else []): None for the first
        token (nothing comes before it), then one entry per prompt token."""
        sp = self._params.get(seq_id)
        if sp is None or sp.prompt_logprobs is None:
            return []
        rest = [int(t) for t in prompt][1:]
        entries = read_logprobs(_lib.lib().dspark_engine_get_prompt_logprobs, self.handle, seq_id, rest,
                                sp.prompt_logprobs)
        return [None, *entries]

    def status(self, seq_id: int) -> str:
        """"active", or why the sequence finished: "length", "eog", "stop", "context_full"."""
        return seq_status_names().get(_lib.lib().dspark_engine_seq_status(self.handle, seq_id), "idle")

    def stats(self, seq_id: int = -1) -> SpecStats:
        """Counters of one sequence, or of all (-1)."""
        ffi = _lib.ffi()
        s = ffi.new("struct dspark_spec_stats *")
        _lib.check(_lib.lib().dspark_engine_get_stats(self.handle, seq_id, s))
        n = max((i + 1 for i in range(_lib.lib().DSPARK_STATS_MAX_POS) if s.drafted_at[i]), default=0)
        return SpecStats(s.n_prompt, s.n_generated, s.n_steps, s.n_drafted, s.n_accepted,
                         [s.drafted_at[i] for i in range(n)], [s.accepted_at[i] for i in range(n)],
                         s.t_prefill_ms, s.t_draft_ms, s.t_verify_ms, s.t_host_ms, s.n_cached)

    def set_abort_callback(self, callback: Any | None) -> None:
        """Call ``callback()`` during add/step computations; a true result stops the call with
        AbortedError, leaving every sequence and both caches as before it (the engine stays usable)."""
        self._set_abort_callback("dspark_engine_set_abort_callback", callback)

    def request_abort(self, requested: bool = True) -> None:
        """Ask the computations in progress (from any thread) to stop, as the abort callback does, or
        withdraw the request; a C-side flag, so no Python runs per graph node."""
        if self._handle is not None:  # a late request after close has nothing left to stop
            _lib.lib().dspark_engine_request_abort(self._handle, bool(requested))

    def remove(self, seq_id: int) -> None:
        """Forget a sequence and free its cells in both caches."""
        _lib.check(_lib.lib().dspark_engine_remove(self.handle, seq_id))
        self._forget(seq_id)

    def _forget(self, seq_id: int) -> None:
        self._params.pop(seq_id, None)
        self._constraints.pop(seq_id, None)

    def detach(self, seq_id: int) -> None:
        """Forget a sequence but leave its cells in both caches, for a later :meth:`add` with
        reuse_prefix (prompt caching); ``target.kv.seq_rm`` / ``draft.kv.seq_rm`` free them."""
        _lib.check(_lib.lib().dspark_engine_detach(self.handle, seq_id))
        self._forget(seq_id)

    def generate(self, prompt: Sequence[int], sampling: SamplingParams | None = None, seq_id: int = 0) -> list[int]:
        """Generate one sequence to completion; returns the new tokens, and the sequence stays in
        the engine (its stats and cells can be read). A token-level helper for tests and
        benchmarks, with no rules of its own: no text, stop strings or context-full policy (a full
        cache raises ContextFullError). Requests with those go through
        :class:`~dspark_ggml.decode_loop.RunningSequences` (the LLM, the CLI, the server)."""
        out = list(self.add(seq_id, prompt, sampling))
        while self.status(seq_id) == "active":
            self.run(1 << 30)
            out += self.new_tokens(seq_id)[0]
        return out


def spec_params(*, n_max: int = 0, n_min: int = 0, p_min: float = 0.0, draft_mode: str = "greedy",
                schedule: str = "static", backend_sampling: bool | str = "auto",
                markov_top_k: int = 0) -> Any:
    """The C struct dspark_spec_params of these settings, the names given as the header's values.
    An unknown name raises here; the values' ranges are the core's to check (dspark_spec_check,
    which dspark_engine_init applies too)."""
    if draft_mode not in draft_modes():
        raise InvalidArgumentError(f"draft_mode must be one of {', '.join(sorted(draft_modes()))}, "
                                   f"got {draft_mode!r}")
    if schedule not in schedules():
        raise InvalidArgumentError(f"schedule must be one of {', '.join(sorted(schedules()))}, "
                                   f"got {schedule!r}")
    p = _lib.ffi().new("struct dspark_spec_params *", _lib.lib().dspark_spec_default_params())
    p.n_max, p.n_min, p.p_min, p.markov_top_k = n_max, n_min, p_min, markov_top_k
    p.draft_mode, p.schedule = draft_modes()[draft_mode], schedules()[schedule]
    p.backend_sampling = backend_sampling_value(backend_sampling)
    return p


def backend_sampling_value(setting: bool | str) -> int:
    """The header's DSPARK_BACKEND_SAMPLING_* value of True / False / "auto"."""
    values = _lib.enum("BACKEND_SAMPLING")
    if setting == "auto":
        return values["auto"]
    if isinstance(setting, bool):
        return values["on" if setting else "off"]
    raise InvalidArgumentError(f"backend_sampling must be True, False or 'auto', got {setting!r}")


def build_engine(target: Model, draft: DraftModel | None = None, *, n_ctx: int = 0,
                 context_options: Mapping[str, Any] | None = None, **engine_options: Any) -> Engine:
    """A target context, a draft context sized like it when there is a draft, and the engine over
    them: the one way the LLM, the benchmark and `dspark-ggml check` assemble speculative decoding.
    ``context_options`` go to both contexts (n_batch, n_seq_max, n_threads, type_kv, flash_attn,
    batch_invariant;
    n_outputs_max_per_seq to the target's only); ``engine_options`` to :class:`Engine`. The contexts
    are ``engine.target`` and ``engine.draft``; closing them is the caller's (after the engine)."""
    options = dict(context_options or {})
    n_out = options.pop("n_outputs_max_per_seq", 0)
    ctx = Context(target, n_ctx=n_ctx, n_outputs_max_per_seq=n_out, **options)
    dctx = DraftContext(draft, n_ctx=ctx.n_ctx, **options) if draft is not None else None
    try:
        return Engine(ctx, dctx, **engine_options)
    except BaseException:
        if dctx is not None:
            dctx.close()
        ctx.close()
        raise

