"""The engine loop: one thread that runs every sequence, admitting and dropping them between steps.

Continuous batching: a request's sequences wait in a bounded queue, take a free slot (an engine
sequence id) at the next step boundary, and give it back when they finish or their client goes
away. With the prompt cache (prompt_cache.py) a slot keeps its cells after its sequence leaves,
and a new sequence goes to the slot holding the longest prefix of its prompt. The loop is the only
thread that touches the engines; it never holds the GIL while ggml computes (cffi releases it for
each C call; the only Python inside a step is a request's grammar constraint, structured.py).

Sequences reach their HTTP request through ``Job.deliver``, called on this thread with a
GenerationChunk (its last one has finish_reason and stats) or a Failure; nothing follows either.
Other work on the models (embeddings) runs on this thread too, between steps (:meth:`Scheduler.call`):
the device is never shared between two threads.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..decode_loop import LiveSequence, Request, RunningSequences
from ..errors import AbortedError, ConstraintError, ContextFullError, DeviceLostError, DSparkError
from .llama_info import generation_params
from .prompt_cache import PromptCache

if TYPE_CHECKING:
    from ..engine import Engine
    from ..results import GenerationChunk, GenerationStats
    from ..tokenizer import Tokenizer
    from .engines import EnginePool, SpecOverride
    from .metrics import Metrics

log = logging.getLogger("dspark_ggml.server")
T = TypeVar("T")


class QueueFullError(Exception):
    """Every slot is busy and the queue behind them is full."""


@dataclass
class Failure:
    """A sequence (choice ``index``) that ended with an error."""

    index: int
    error: Exception


@dataclass(eq=False)
class Job:
    """One sequence to generate: a request (one choice of it) and where its output goes."""

    request: Request
    speculative: SpecOverride | None
    deliver: Callable[[object], None]
    cache_prompt: bool = True  # may reuse cached cells of its prompt (the request's cache_prompt)
    task_id: int = -1  # numbered at submission: /slots shows it (llama-server's id_task)
    cancelled: bool = False
    finished: bool = False


@dataclass(eq=False)
class _Slot:
    job: Job
    seq: LiveSequence
    running: RunningSequences = field(repr=False)  # of the engine the job runs in
    n_cached: int = 0  # prompt tokens the prompt cache served
    generated: list[str] = field(default_factory=list)  # the text handed out so far

    @property
    def seq_id(self) -> int:
        return self.seq.seq_id

    @property
    def engine(self) -> Engine:
        return self.running.engine


class Scheduler:
    """Runs jobs through the engines, ``n_slots`` at a time, at most ``capacity`` admitted.

    Args:
        pool: the engines (one per speculative setting).
        tokenizer: for text; None = token ids only.
        n_slots: engine sequences (the target context's n_seq_max or fewer).
        capacity: jobs admitted at once (running + waiting); submit() beyond it raises QueueFullError.
        metrics: counters updated as sequences finish.
        cache: the prompt cache: where sequences go, and which idle cells make room (None: off).
    """

    def __init__(self, pool: EnginePool, tokenizer: Tokenizer | None, n_slots: int, capacity: int,
                 metrics: Metrics, cache: PromptCache | None = None) -> None:
        self._pool = pool
        self._tokenizer = tokenizer
        self.n_slots = n_slots
        self._capacity = capacity
        self._metrics = metrics
        self._cache = cache if cache is not None else PromptCache([], 0, enabled=False)
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._admitted = 0  # jobs submitted and not yet finished (waiting or running)
        self._slots: dict[int, _Slot] = {}
        self._last: dict[int, dict[str, Any]] = {}  # seq id -> what /slots shows of its last job
        self._task_ids = itertools.count()
        self._running: dict[int, RunningSequences] = {}  # id(engine) -> its sequences, while it has some
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._stopping = False
        self.device_lost: str | None = None  # why the models' device stopped answering, once it did
        # after the last step: cells in use per cache, then those the idle slots hold (PromptCache.cells_used)
        self.kv_cells_used: list[int] = self._cache.cells_used()
        self._thread = threading.Thread(target=self._run, name="dspark-engine-loop", daemon=True)

    # ---- the HTTP side (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        """Queue a request's jobs, all or none (QueueFullError)."""
        with self._cv:
            if self._stopping:
                raise QueueFullError("the server is shutting down")
            if self._admitted + len(jobs) > self._capacity:
                raise QueueFullError(f"all {self.n_slots} slots are busy and the queue is full")
            for job in jobs:
                job.task_id = next(self._task_ids)
            self._waiting.extend(jobs)
            self._admitted += len(jobs)
            self._cv.notify()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine loop thread between two steps; its result (or exception) comes
        in the future. QueueFullError when the server is shutting down."""
        future: Future[T] = Future()
        with self._cv:
            if self._stopping:
                raise QueueFullError("the server is shutting down")
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def cancel(self, job: Job) -> None:
        """Drop a job: at once if it waits, at the next step boundary if it runs (its KV cells freed)."""
        with self._cv:
            job.cancelled = True
            self._cv.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel whatever is left and end the loop thread."""
        with self._cv:
            self._stopping = True
            for job in self._waiting:
                job.cancelled = True
            for slot in self._slots.values():
                slot.job.cancelled = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def busy_slots(self) -> int:
        return len(self._slots)

    @property
    def cached_slots(self) -> int:
        return self._cache.idle_slots

    def slots(self) -> list[dict[str, Any]]:
        """What each slot (engine sequence) runs, or last ran, as /slots shows it: run through
        :meth:`call`, on the loop thread, between two steps."""
        out = []
        for seq_id in range(self.n_slots):
            slot = self._slots.get(seq_id)
            info = _slot_info(slot, processing=True) if slot is not None else self._last.get(seq_id, {})
            out.append({"id": seq_id, "is_processing": slot is not None, **info})
        return out

    # ---- the loop (engine thread) -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self._slots or self._calls or self._stopping):
                    self._cv.wait()
                if self._stopping and not self._slots and all(j.cancelled for j in self._waiting):
                    self._waiting.clear()
                    for _, future in self._calls:
                        future.set_exception(QueueFullError("the server is shutting down"))
                    self._calls.clear()
                    return
                arrivals = self._take_arrivals()
                calls = list(self._calls)
                self._calls.clear()
            self._run_calls(calls)
            try:
                self._drop_cancelled()
                self._admit(arrivals)
                self._step_all()
            except Exception as e:  # noqa: BLE001 (a bug here must not leave every client waiting)
                log.exception("engine loop error: failing the requests in flight")
                self._fail_all(arrivals, e)
            self.kv_cells_used = self._cache.cells_used()  # read here, on the thread that writes the caches

    @staticmethod
    def _run_calls(calls: list[tuple[Callable[[], Any], Future]]) -> None:
        for fn, future in calls:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 (the caller's to handle)
                future.set_exception(e)

    def _take_arrivals(self) -> list[Job]:
        """Waiting jobs that get a slot now (cancelled ones are dropped on the way). Lock held."""
        taken: list[Job] = []
        while self._waiting and len(self._slots) + len(taken) < self.n_slots:
            job = self._waiting.popleft()
            if job.cancelled:
                self._done(job, "cancelled")
            else:
                taken.append(job)
        return taken

    def _drop_cancelled(self) -> None:
        for slot in [s for s in self._slots.values() if s.job.cancelled]:
            self._release(slot)
            self._done(slot.job, "cancelled")

    def _admit(self, arrivals: list[Job]) -> None:
        for i, job in enumerate(arrivals):
            try:
                engine = self._pool.acquire(job.speculative)
                try:
                    running = self._running.get(id(engine)) or RunningSequences(engine, self._tokenizer)
                    seq, chunk, n_cached = self._start(job, running)
                except BaseException:
                    self._pool.release(engine)  # the sequence never ran: the engine is not held
                    raise
            except ContextFullError as e:
                if self._slots:  # the cells are shared: wait until a running sequence frees some
                    with self._cv:
                        self._waiting.extendleft(reversed(arrivals[i:]))
                    return
                self._fail(job, e)
                continue
            except DSparkError as e:
                self._note_device_loss(e)
                self._fail(job, e)
                continue
            self._running[id(engine)] = running
            slot = self._slots[seq.seq_id] = _Slot(job, seq, running, n_cached)
            self._emit(slot, chunk)

    def _start(self, job: Job, running: RunningSequences) -> tuple[LiveSequence, GenerationChunk, int]:
        """Prefill a job in the slot the prompt cache chooses; its first chunk and the prompt
        tokens the cache served. When the cells run
        out, idle slots give theirs up (least recently used first) before ContextFullError."""
        r = job.request
        reuse = self._cache.enabled and job.cache_prompt
        engine = running.engine
        while True:
            seq_id, n_cached = self._cache.choose(engine, r.prompt, self._free_slots(), reuse)
            self._cache.make_room(len(r.prompt) - n_cached + engine.n_draft + 1, keep=seq_id)
            try:
                started = running.start(r, seq_id, reuse_prefix=reuse)
            except ContextFullError:
                self._cache.take(seq_id)  # the failed add freed its cells
                if not self._cache.reclaim():
                    raise
                continue
            self._cache.take(seq_id)
            return (*started, n_cached)

    def _step_all(self) -> None:
        """One step of every engine that has sequences (several only with per-request overrides)."""
        # room for every verify block first: a step that fails for want of cells is redone
        self._cache.make_room(sum(s.engine.n_draft + 1 for s in self._slots.values()))
        for running in list(self._running.values()):
            try:
                outcome = running.step()
            except DSparkError as e:
                self._engine_failed(running, e)
                continue
            failure = outcome.failure
            if isinstance(failure, AbortedError):  # nothing here requests one: a failure like any
                self._engine_failed(running, failure)
                continue
            if isinstance(failure, ContextFullError) and self._cache.reclaim():
                continue  # idle cells freed: the next round steps it again (a failed step commits nothing)
            for seq, chunk in outcome.chunks:
                self._emit(self._slots[seq.seq_id], chunk)
            if isinstance(failure, ConstraintError):
                self._constraint_failed(failure)
            elif isinstance(failure, ContextFullError) and running.live:
                victim = self._slots[running.context_full_victim().seq_id]
                self._finish(victim, victim.seq.last_chunk("context_full"))

    def _engine_failed(self, running: RunningSequences, error: DSparkError) -> None:
        """An engine's step failed: its requests fail (their cells are not kept)."""
        self._note_device_loss(error)
        log.error("engine step failed: %s", error)
        for slot in [s for s in self._slots.values() if s.running is running]:
            self._release(slot, keep_cells=False)
            self._fail(slot.job, error)

    def _constraint_failed(self, error: ConstraintError) -> None:
        """A sequence's grammar failed in a step (its matcher gave up, e.g. a schema past the grammar
        engine's limits): that request fails; the others keep what the step committed (their chunks
        went out already) and go on."""
        log.warning("structured output failed for a request: %s", error)
        slot = self._slots.get(error.seq_id)
        if slot is not None:
            self._release(slot, keep_cells=False)
            self._fail(slot.job, error)

    # ---- helpers ----------------------------------------------------------------------------------

    def _emit(self, slot: _Slot, chunk: GenerationChunk) -> None:
        slot.generated.append(chunk.text or "")
        if chunk.finish_reason is not None:
            self._finish(slot, chunk)
        else:
            slot.job.deliver(chunk)

    def _finish(self, slot: _Slot, chunk: GenerationChunk) -> None:
        """Attach the statistics to a sequence's last chunk, free its slot, deliver the chunk."""
        chunk.stats = self._release(slot)
        self._done(slot.job, chunk.finish_reason or "stop")
        slot.job.deliver(chunk)

    def _release(self, slot: _Slot, keep_cells: bool = True) -> GenerationStats:
        """Free a running sequence's slot; its KV cells stay there for the prompt cache (unless it
        is off, or the engine failed), its counters go to the metrics."""
        keep = keep_cells and self._cache.enabled
        try:
            stats = slot.running.leave(slot.seq, keep_cells=keep)
            if keep:
                self._cache.park(slot.seq_id)
        finally:
            self._last[slot.seq_id] = _slot_info(slot, processing=False)
            del self._slots[slot.seq_id]
            self._forget_if_idle(slot.running)
            self._pool.release(slot.engine)
        self._metrics.record_sequence(stats)
        return stats

    def _forget_if_idle(self, running: RunningSequences) -> None:
        if not running.live and self._running.get(id(running.engine)) is running:
            del self._running[id(running.engine)]  # the pool may close the engine now

    def _note_device_loss(self, error: Exception) -> None:
        if isinstance(error, DeviceLostError):
            self.device_lost = str(error)  # /health says so from now on

    def _fail(self, job: Job, error: Exception) -> None:
        self._done(job, "error")
        job.deliver(Failure(job.request.index, error))

    def _done(self, job: Job, reason: str) -> None:
        """A job leaves the server (once)."""
        with self._cv:
            if job.finished:
                return
            job.finished = True
            self._admitted -= 1
        self._metrics.record_finish(reason)

    def _fail_all(self, arrivals: list[Job], error: Exception) -> None:
        """After an unexpected error: end every running sequence and this round's arrivals."""
        for slot in list(self._slots.values()):
            try:
                slot.running.abandon()
            except Exception:  # noqa: BLE001 (best effort: the engine may be what failed)
                pass
            del self._slots[slot.seq_id]
            self._forget_if_idle(slot.running)
            try:
                self._pool.release(slot.engine)
            except Exception:  # noqa: BLE001
                pass
            self._fail(slot.job, error)
        for job in arrivals:
            if not job.finished:
                self._fail(job, error)

    def _free_slots(self) -> set[int]:
        return set(range(self.n_slots)) - set(self._slots)


def _slot_info(slot: _Slot, processing: bool) -> dict[str, Any]:
    """A slot's job under llama-server's /slots names (its prompt as tokens: the route detokenizes)."""
    r = slot.job.request
    s = r.sampling
    n_decoded = slot.seq.n_tokens
    text = "".join(slot.generated)
    return {"id_task": slot.job.task_id, "speculative": slot.engine.n_draft > 0,
            "n_prompt_tokens": len(r.prompt), "n_prompt_tokens_processed": len(r.prompt) - slot.n_cached,
            "n_prompt_tokens_cache": slot.n_cached,
            "params": {**generation_params(s), "stop": list(r.stop_texts)},
            "next_token": [{"has_next_token": processing, "has_new_line": "\n" in text,
                            "n_remain": s.max_tokens - n_decoded if s.max_tokens is not None else -1,
                            "n_decoded": n_decoded}],
            "prompt_tokens": list(r.prompt), "generated": text}
