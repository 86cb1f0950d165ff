"""The server's engine loop in-process (no HTTP): per-request speculative engines over shared
contexts, cancellation, the admission limit, a full context, and engine errors."""
from __future__ import annotations

import queue
import time

import pytest

from dspark_ggml import LLM
from dspark_ggml.decode_loop import Request
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH
from dspark_ggml.errors import InvalidArgumentError
from dspark_ggml.sampling import SamplingParams
from dspark_ggml.server.engines import EnginePool, SpecOverride
from dspark_ggml.server.metrics import Metrics
from dspark_ggml.server.scheduler import Failure, Job, QueueFullError, Scheduler

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def target_only():
    with LLM(TARGET_PATH, n_threads=1, flash_attn=False) as llm:
        yield llm


@pytest.fixture
def make_scheduler():
    made = []

    def make(n_slots=2, capacity=8, **llm_options):
        llm_options.setdefault("speculative", {"schedule": "static"})  # a fixed block: counted engines
        llm = LLM(TARGET_PATH, draft_model_path=DRAFT_PATH, n_threads=1, n_seq_max=n_slots, flash_attn=False,
                  **llm_options)
        pool = EnginePool(llm)
        sched = Scheduler(pool, llm.tokenizer, n_slots, capacity, Metrics())
        sched.start()
        made.append((sched, pool, llm))
        return sched, pool, llm

    yield make
    for sched, pool, llm in made:
        sched.stop(10)
        pool.close()
        llm.close()


def job(llm, prompt=PROMPT, max_tokens=16, speculative=None, index=0):
    """A Job whose events land in ``job.events`` (a thread-safe queue)."""
    events: queue.Queue = queue.Queue()
    request = Request(llm.tokenize(prompt, parse_special=True), SamplingParams(max_tokens=max_tokens), [], [],
                      index)
    j = Job(request, speculative, events.put)
    j.events = events  # type: ignore[attr-defined]
    return j


def result(j, timeout=60.0):
    """(tokens, finish_reason, stats) once the job's last event came, or its Failure."""
    tokens = []
    while True:
        ev = j.events.get(timeout=timeout)
        if isinstance(ev, Failure):
            return ev
        tokens += ev.tokens
        if ev.finish_reason is not None:
            return tokens, ev.finish_reason, ev.stats


def wait_until(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_pool_removes_the_python_abort_callback(make_scheduler):
    _, pool, llm = make_scheduler()
    assert pool.default is llm.engine and llm.engine._abort_cb is None  # no Python call per graph node


def test_speculative_off_and_n_max_share_the_contexts(make_scheduler, target_only):
    sched, pool, llm = make_scheduler()
    want = target_only.generate(PROMPT, max_tokens=24).tokens
    before = job(llm, max_tokens=24)
    sched.submit([before])
    _, _, s_before = result(before)
    off, after = job(llm, max_tokens=24, speculative=SpecOverride(off=True)), job(llm, max_tokens=24)
    sched.submit([off])  # creates the draftless engine, which turns feature capture off in the shared context
    t_off, _, s_off = result(off)
    sched.submit([after])
    t_after, _, s_after = result(after)
    assert t_off == t_after == want  # greedy: the setting changes speed only
    assert s_off.n_drafted == 0
    # the pool turned capture back on: the draft sees the same features, so it drafts the same
    assert s_before.n_accepted > 0
    assert (s_after.accepted_at, s_after.drafted_at) == (s_before.accepted_at, s_before.drafted_at)
    small = job(llm, max_tokens=24, speculative=SpecOverride(n_max=2))
    sched.submit([small, job(llm, max_tokens=24, speculative=SpecOverride(off=True))])
    t_small, _, s_small = result(small)
    assert t_small == want and s_small.n_drafted > 0 and len(s_small.drafted_at) <= 2  # at most 2 positions
    wait_until(lambda: sched.busy_slots == 0)
    assert len(pool.engines()) == 2  # the default and target-only engines; n_max=2's left with its sequence


def test_engines_are_counted_and_freed(make_scheduler):
    """An override engine lives while a sequence holds it: more than MAX_ENGINES settings over
    time are fine, MAX_ENGINES + 1 at once are not (the last must wait)."""
    from dspark_ggml.server.engines import MAX_ENGINES, TooManySettingsError

    _, pool, llm = make_scheduler()
    assert pool.acquire(SpecOverride(n_max=99)) is pool.default  # clamped to the draft's maximum: the default
    a = pool.acquire(SpecOverride(n_max=2))
    assert pool.acquire(SpecOverride(n_max=2, p_min=0.0)) is a  # the same setting, held twice
    assert MAX_ENGINES == 8 and llm.draft_model.info.max_draft == 8  # n_max 1 .. 7 are 7 settings
    held = [pool.acquire(SpecOverride(n_max=k)) for k in (1, 3, 4, 5, 6, 7)]
    held.append(pool.acquire(SpecOverride(n_max=2, ignore_eos=True)))
    off = pool.acquire(SpecOverride(off=True))  # the target-only engine is not counted
    with pytest.raises(TooManySettingsError):
        pool.acquire(SpecOverride(n_max=1, ignore_eos=True))
    pool.release(a)
    assert a in pool.engines()  # still held once
    pool.release(a)
    assert a not in pool.engines()
    b = pool.acquire(SpecOverride(n_max=1, ignore_eos=True))  # room again
    for e in [b, off, *held]:
        pool.release(e)
    assert pool.engines() == [pool.default, off]


def test_overrides_the_setting_cannot_take_are_refused():
    with LLM(TARGET_PATH, draft_model_path=DRAFT_PATH, n_threads=1, n_seq_max=1, flash_attn=False,
             speculative={"schedule": "confidence"}) as llm:
        pool = EnginePool(llm)
        assert pool.acquire(SpecOverride(off=True)) is not pool.default
        with pytest.raises(InvalidArgumentError, match="static or adaptive"):
            pool.acquire(SpecOverride(n_max=3))
        eos = pool.acquire(SpecOverride(ignore_eos=True))  # the server's n_max: static, no calibration
        assert eos is not pool.default
        pool.release(eos)
        pool.close()


def test_adaptive_schedule_is_lossless_in_a_batch_and_takes_overrides(make_scheduler, target_only):
    """The server's default schedule: greedy requests decoded together (the block length changes
    with the batch) return what the target alone generates; a request's n_max runs a fixed block
    (an engine created while serving: it cannot calibrate, so it is static)."""
    sched, pool, llm = make_scheduler(n_slots=4, speculative={"schedule": "adaptive"})
    prompts = [PROMPT, "import os\n", "class Stack:\n", "try:\n"]
    jobs = [job(llm, p, max_tokens=40, index=i) for i, p in enumerate(prompts)]
    sched.submit(jobs)
    for j, p in zip(jobs, prompts):
        assert result(j)[0] == target_only.generate(p, max_tokens=40).tokens
    fixed = job(llm, max_tokens=24, speculative=SpecOverride(n_max=2))
    sched.submit([fixed])
    tokens, _, stats = result(fixed)
    assert tokens == target_only.generate(PROMPT, max_tokens=24).tokens
    assert stats.n_drafted > 0 and len(stats.drafted_at) <= 2  # a fixed block of 2, every step


def test_cancel_frees_the_slot_at_the_next_step(make_scheduler):
    sched, _, llm = make_scheduler(n_slots=1)
    long = job(llm, max_tokens=3000)
    sched.submit([long])
    long.events.get(timeout=30)  # running
    assert sched.busy_slots == 1
    sched.cancel(long)
    wait_until(lambda: sched.busy_slots == 0)
    assert llm.context.kv_n_used == 0  # its cells were released
    after = job(llm, max_tokens=4)
    sched.submit([after])
    assert result(after)[1] == "length"
    assert sched._metrics.render({}).count('reason="cancelled"} 1') == 1


def test_admission_is_bounded(make_scheduler):
    sched, _, llm = make_scheduler(n_slots=1, capacity=2)
    first = [job(llm, max_tokens=3000), job(llm, max_tokens=3000)]
    sched.submit(first)
    with pytest.raises(QueueFullError):
        sched.submit([job(llm)])
    with pytest.raises(QueueFullError):  # all choices of a request or none
        sched.submit([job(llm), job(llm, index=1)])
    for j in first:
        sched.cancel(j)
    wait_until(lambda: sched.busy_slots == 0 and sched.queue_depth == 0)
    sched.submit([job(llm)])  # room again


def test_a_full_context_ends_the_longest_sequence(make_scheduler):
    sched, _, llm = make_scheduler(n_slots=2, n_ctx=160)
    jobs = [job(llm, max_tokens=500, index=0), job(llm, "import os\n", max_tokens=500, index=1)]
    sched.submit(jobs)
    reasons = sorted(result(j)[1] for j in jobs)
    assert reasons == ["context_full", "context_full"]
    assert sched.busy_slots == 0 and llm.context.kv_n_used == 0


def test_an_engine_error_fails_the_request_not_the_loop(make_scheduler, target_only):
    sched, _, llm = make_scheduler()
    bad = job(llm)
    bad.request.prompt = [llm.n_vocab + 5]  # the engine refuses it at add()
    sched.submit([bad])
    failure = result(bad)
    assert isinstance(failure, Failure) and isinstance(failure.error, InvalidArgumentError)
    good = job(llm, max_tokens=8)
    sched.submit([good])
    assert result(good)[0] == target_only.generate(PROMPT, max_tokens=8).tokens


class FailingConstraint:
    """Allows every token; its ``fill_masks`` raises on call ``fail_at`` (a grammar engine giving up)."""

    def __init__(self, n_vocab: int, fail_at: int) -> None:
        self.n_vocab, self.calls, self.fail_at = n_vocab, 0, fail_at

    def fill_masks(self, tokens, out):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the grammar gave up")
        out[: len(tokens) + 1] = 0xFFFFFFFF
        return len(tokens) + 1

    def commit(self, tokens):
        pass


def test_a_failing_constraint_fails_its_request_only(make_scheduler, target_only):
    from dspark_ggml.errors import ConstraintError

    sched, _, llm = make_scheduler()
    want = target_only.generate(PROMPT, max_tokens=24).tokens
    other, bad = job(llm, max_tokens=24), job(llm, max_tokens=24, index=1)
    bad.request.constraint = FailingConstraint(llm.n_vocab, fail_at=3)
    sched.submit([other, bad])
    failure = result(bad)
    assert isinstance(failure, Failure) and isinstance(failure.error, ConstraintError)
    tokens, finish, _ = result(other)
    assert tokens == want and finish == "length"  # nothing lost or repeated around the failed step
    again = job(llm, max_tokens=24)
    sched.submit([again])
    assert result(again)[0] == want
