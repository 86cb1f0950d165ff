"""Driving an engine for requests: the sequences running in it, their text, stops and aborts.

:class:`RunningSequences` is the one place requests are started in an engine, the engine stepped
for them, and what each step committed turned into chunks (text, stop strings, logprobs); the
context-full rule is here too. Two loops sit on it: :class:`DecodeLoop` (the Python API and the CLI:
requests in at most ``n_slots`` sequences at once, the next waiting one taking a finished one's
slot) and the server's threaded Scheduler (queues, the prompt cache, several engines).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .engine import Engine
from .logprobs import TokenLogprob
from .errors import AbortedError, ConstraintError, ContextFullError
from .interrupt import Interrupt
from .results import ENGINE_FINISH, GenerationChunk, GenerationStats
from .sampling import SamplingParams
from .stops import StopStringMatcher

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


@dataclass
class Request:
    """One prompt to generate from. ``index`` is echoed in its chunks."""

    prompt: list[int]
    sampling: SamplingParams
    stop_texts: list[str]
    stop_token_ids: list[int]
    index: int = 0
    constraint: Any | None = None  # a token constraint for Engine.add (structured output)


class LiveSequence:
    """A request while it occupies an engine sequence: its text state and clocks."""

    def __init__(self, request: Request, seq_id: int, tokenizer: Tokenizer | None) -> None:
        from .tokenizer import IncrementalDetokenizer

        self.request = request
        self.seq_id = seq_id
        self.detokenizer = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.stops = StopStringMatcher(request.stop_texts)
        self.n_tokens = 0
        self.t_start = time.perf_counter()
        self.t_prefilled = self.t_start
        self.prompt_logprobs: list[TokenLogprob | None] | None = None  # handed out with the first chunk

    def accept(self, tokens: Sequence[int], from_draft: Sequence[bool], status: str,
               logprobs: list[TokenLogprob] | None = None) -> GenerationChunk:
        """Turn tokens the engine committed into a chunk; ``status`` is the engine's after them;
        ``logprobs`` (a request with logprobs) one entry per token."""
        ended_by_token = status in ("eog", "stop")
        texts: list[str] = []
        n_kept = len(tokens)
        for i, token in enumerate(tokens):
            if ended_by_token and i == len(tokens) - 1:
                break  # the end-of-generation / stop token itself is not text
            texts.append(self.stops.feed(self._piece(token)))
            if self.stops.stopped:
                n_kept = i + 1
                break
        finish = "stop" if self.stops.stopped else ENGINE_FINISH.get(status)
        if finish is not None:
            texts.append(self._final_text())
            finish = "stop" if self.stops.stopped else finish
        self.n_tokens += n_kept
        return GenerationChunk("".join(texts), list(tokens[:n_kept]), list(from_draft[:n_kept]),
                               self.request.index, finish,
                               logprobs=logprobs[:n_kept] if logprobs is not None else None,
                               ended_by_token=ended_by_token and n_kept == len(tokens) > 0)

    def chunk(self, engine: Engine, tokens: Sequence[int], from_draft: Sequence[bool]) -> GenerationChunk:
        """The chunk of tokens the engine just committed for this sequence, with their logprobs when
        the request asked for them, and on the first chunk the prompt's: the one place both loops
        (DecodeLoop, the server's Scheduler) turn engine output into chunks."""
        want = self.request.sampling.logprobs is not None
        logprobs = engine.new_logprobs(self.seq_id) if want else None
        chunk = self.accept(tokens, from_draft, engine.status(self.seq_id), logprobs)
        chunk.prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None
        return chunk

    @classmethod
    def start(cls, engine: Engine, request: Request, seq_id: int, tokenizer: Tokenizer | None,
              reuse_prefix: bool = False) -> tuple[LiveSequence, list[int]]:
        """Prefill ``request`` in engine sequence ``seq_id``: the live sequence and its first tokens.

        Raises:
            ContextFullError: the KV cells (shared by all sequences) have no room for the prompt
                now; nothing changed.
        """
        seq = cls(request, seq_id, tokenizer)
        tokens = engine.add(seq_id, request.prompt, request.sampling, [[t] for t in request.stop_token_ids],
                            reuse_prefix=reuse_prefix, constraint=request.constraint)
        if request.sampling.prompt_logprobs is not None:
            seq.prompt_logprobs = engine.prompt_logprobs(seq_id, request.prompt)
        return seq, tokens

    def last_chunk(self, reason: str) -> GenerationChunk:
        """The last chunk of a sequence ended from outside (abort, full cache): the held-back text."""
        return GenerationChunk(self._final_text(), [], [], self.request.index, reason)

    def stats(self, engine: Engine) -> GenerationStats:
        now = time.perf_counter()
        return GenerationStats.from_spec(engine.stats(self.seq_id),
                                         t_decode_ms=(now - self.t_prefilled) * 1e3,
                                         t_total_ms=(now - self.t_start) * 1e3)

    def _piece(self, token: int) -> str:
        return self.detokenizer.add(token) if self.detokenizer is not None else ""

    def _final_text(self) -> str:
        """Bytes the detokenizer held back, then text held back for a possible stop string."""
        tail = self.detokenizer.flush() if self.detokenizer is not None else ""
        return self.stops.feed(tail) + self.stops.flush()


@dataclass
class StepOutcome:
    """What a step of the engine gave: a chunk per sequence (those with tokens, or all when the
    step succeeded), and the error that stopped it, if one did (after the chunks of the steps
    before it). A sequence whose grammar failed (ConstraintError) gets no chunk."""

    chunks: list[tuple[LiveSequence, GenerationChunk]]
    failure: ContextFullError | AbortedError | ConstraintError | None = None


class RunningSequences:
    """The requests running in one engine: starting them, stepping the engine, their chunks."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer | None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.live: dict[int, LiveSequence] = {}

    def start(self, request: Request, seq_id: int,
              reuse_prefix: bool = False) -> tuple[LiveSequence, GenerationChunk]:
        """Prefill ``request`` in sequence ``seq_id``: the live sequence and its first chunk (which
        may be its last: see :meth:`leave`).

        Raises:
            ContextFullError: the KV cells have no room for the prompt now; nothing changed.
        """
        seq, tokens = LiveSequence.start(self.engine, request, seq_id, self.tokenizer, reuse_prefix)
        seq.t_prefilled = time.perf_counter()
        self.live[seq_id] = seq
        return seq, seq.chunk(self.engine, tokens, [False] * len(tokens))

    def step(self, n_steps: int = 1) -> StepOutcome:
        """Run up to ``n_steps`` steps (the engine returns early when a sequence finishes)."""
        failure: ContextFullError | AbortedError | ConstraintError | None = None
        try:
            self.engine.run(n_steps)
        except (ContextFullError, AbortedError, ConstraintError) as e:
            failure = e  # the steps before the failing one committed tokens: they are handed out
        chunks = []
        for seq in list(self.live.values()):
            if isinstance(failure, ConstraintError) and seq.seq_id == failure.seq_id:
                continue
            tokens, from_draft = self.engine.new_tokens(seq.seq_id)
            if tokens or failure is None:
                chunks.append((seq, seq.chunk(self.engine, tokens, from_draft)))
        return StepOutcome(chunks, failure)

    def context_full_victim(self) -> LiveSequence:
        """The sequence to end when a step finds the KV cells full: they are shared by the sequences,
        so the longest one (prompt and generated tokens) ends with "context_full" and the others go on."""
        return max(self.live.values(), key=lambda s: len(s.request.prompt) + s.n_tokens)

    def leave(self, seq: LiveSequence, keep_cells: bool = False) -> GenerationStats:
        """A sequence is done: its statistics; the engine forgets it, its KV cells freed (or, with
        ``keep_cells``, left in place for a later prompt to reuse: Engine.detach)."""
        stats = seq.stats(self.engine)
        try:
            if keep_cells:
                self.engine.detach(seq.seq_id)
            else:
                self.engine.remove(seq.seq_id)
        finally:
            del self.live[seq.seq_id]
        return stats

    def abandon(self) -> None:
        """Remove every sequence still in the engine (best effort: after a failure)."""
        for seq_id in list(self.live):
            if self.engine.status(seq_id) != "idle":
                self.engine.remove(seq_id)
        self.live.clear()


class DecodeLoop:
    """Runs requests through an engine; one loop at a time per engine.

    Args:
        engine: the engine (its target context has at least ``n_slots`` sequences).
        n_slots: sequences run at once.
        tokenizer: for text; None = token ids only (chunks carry no text).
        interrupt: the stop request the engine's abort callback reads.
        per_step: hand out a chunk per verify step (streaming). Otherwise the engine runs steps
            without returning until a sequence finishes, as long as no request has stop strings
            (those are matched on the text, here, after each step).
    """

    def __init__(self, engine: Engine, n_slots: int, tokenizer: Tokenizer | None,
                 interrupt: Interrupt, per_step: bool = True) -> None:
        self.running = RunningSequences(engine, tokenizer)
        self.n_slots = n_slots
        self.interrupt = interrupt
        self.per_step = per_step

    @property
    def live(self) -> dict[int, LiveSequence]:
        return self.running.live

    def run(self, requests: Sequence[Request]) -> Iterator[GenerationChunk]:
        """Yield chunks until every request has finished (each request's last chunk has a
        finish_reason). Sequences still in the engine are removed however this ends.

        Raises:
            KeyboardInterrupt: Ctrl-C stopped it (after the sequences were removed).
            ConstraintError: a request's grammar failed (its matcher gave up).
        """
        waiting = deque(requests)
        try:
            while waiting or self.live:
                try:
                    yield from self._fill_slots(waiting)
                    if self.live:
                        yield from self._step()
                    if self.interrupt.is_set():
                        raise AbortedError("abort requested")
                except AbortedError:
                    yield from self._abort_all(waiting)
        finally:
            self.running.abandon()

    # ---- phases ---------------------------------------------------------------------------------

    def _fill_slots(self, waiting: deque[Request]) -> Iterator[GenerationChunk]:
        while waiting and len(self.live) < self.n_slots:
            try:
                with self.interrupt.catching_sigint():
                    seq, chunk = self.running.start(waiting[0], self._free_slot())
            except ContextFullError:
                if not self.live:
                    raise
                return  # the cache is shared: wait for a running sequence to finish
            waiting.popleft()
            yield self._handed_out(seq, chunk)

    def _steps_per_call(self) -> int:
        if self.per_step or any(seq.request.stop_texts for seq in self.live.values()):
            return 1
        return 1 << 30  # the engine returns when a sequence finishes

    def _step(self) -> Iterator[GenerationChunk]:
        with self.interrupt.catching_sigint():
            outcome = self.running.step(self._steps_per_call())
        for seq, chunk in outcome.chunks:
            yield self._handed_out(seq, chunk)
        if isinstance(outcome.failure, (AbortedError, ConstraintError)):
            raise outcome.failure
        if outcome.failure is not None and self.live:
            victim = self.running.context_full_victim()
            yield self._finish(victim, victim.last_chunk("context_full"))

    def _abort_all(self, waiting: deque[Request]) -> Iterator[GenerationChunk]:
        if self.interrupt.by_signal:
            raise KeyboardInterrupt  # run() removes the sequences (finally) before the caller sees it
        for seq in list(self.live.values()):
            yield self._finish(seq, seq.last_chunk("aborted"))
        while waiting:
            yield GenerationChunk("", [], [], waiting.popleft().index, "aborted", GenerationStats())

    # ---- helpers --------------------------------------------------------------------------------

    def _handed_out(self, seq: LiveSequence, chunk: GenerationChunk) -> GenerationChunk:
        return self._finish(seq, chunk) if chunk.finish_reason else chunk

    def _finish(self, seq: LiveSequence, chunk: GenerationChunk) -> GenerationChunk:
        """Attach the statistics to a sequence's last chunk and free its slot."""
        chunk.stats = self.running.leave(seq)
        return chunk

    def _free_slot(self) -> int:
        return min(set(range(self.n_slots)) - set(self.live))
