"""The generation loop: requests through the engine's sequence slots, text, stops and aborts.

Requests run in at most ``n_slots`` engine sequences at once; when one finishes, the next waiting
request takes its slot (continuous batching). Each engine step commits tokens for every active
sequence; they are turned into text here, cut at stop strings, and handed out as chunks.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from .engine import Engine
from .logprobs import TokenLogprob
from .errors import AbortedError, ContextFullError
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

    def close(self, engine: Engine) -> GenerationStats:
        """The sequence's statistics; then the engine forgets it (its KV cells are freed)."""
        stats = self.stats(engine)
        engine.remove(self.seq_id)
        return stats

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


def context_full_victim(seqs: Iterable[LiveSequence]) -> LiveSequence:
    """The sequence to end when a step finds the KV cells full: they are shared by the sequences,
    so the longest one (prompt and generated tokens) ends with "context_full" and the others go on."""
    return max(seqs, key=lambda s: len(s.request.prompt) + s.n_tokens)


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
        self.engine = engine
        self.n_slots = n_slots
        self.tokenizer = tokenizer
        self.interrupt = interrupt
        self.per_step = per_step
        self.live: dict[int, LiveSequence] = {}

    def run(self, requests: Sequence[Request]) -> Iterator[GenerationChunk]:
        """Yield chunks until every request has finished (each request's last chunk has a
        finish_reason). Sequences still in the engine are removed however this ends.

        Raises:
            KeyboardInterrupt: Ctrl-C stopped it (after the sequences were removed).
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
            self._remove_all()

    # ---- phases ---------------------------------------------------------------------------------

    def _fill_slots(self, waiting: deque[Request]) -> Iterator[GenerationChunk]:
        while waiting and len(self.live) < self.n_slots:
            try:
                with self.interrupt.catching_sigint():
                    seq, tokens = LiveSequence.start(self.engine, waiting[0], self._free_slot(),
                                                     self.tokenizer)
            except ContextFullError:
                if not self.live:
                    raise
                return  # the cache is shared: wait for a running sequence to finish
            waiting.popleft()
            seq.t_prefilled = time.perf_counter()
            self.live[seq.seq_id] = seq
            yield self._chunk(seq, tokens, [False] * len(tokens))

    def _steps_per_call(self) -> int:
        if self.per_step or any(seq.request.stop_texts for seq in self.live.values()):
            return 1
        return 1 << 30  # the engine returns when a sequence finishes

    def _step(self) -> Iterator[GenerationChunk]:
        failure: Exception | None = None
        try:
            with self.interrupt.catching_sigint():
                self.engine.run(self._steps_per_call())
        except (ContextFullError, AbortedError) as e:
            failure = e  # the steps before the failing one committed tokens: hand them out first
        for seq in list(self.live.values()):
            tokens, from_draft = self.engine.new_tokens(seq.seq_id)
            if tokens or failure is None:
                yield self._chunk(seq, tokens, from_draft)
        if isinstance(failure, AbortedError):
            raise failure
        if failure is not None and self.live:
            victim = context_full_victim(self.live.values())
            yield self._finish(victim, victim.last_chunk("context_full"))

    def _abort_all(self, waiting: deque[Request]) -> Iterator[GenerationChunk]:
        if self.interrupt.by_signal:
            raise KeyboardInterrupt  # run() removes the sequences (finally) before the caller sees it
        for seq in list(self.live.values()):
            yield self._finish(seq, seq.last_chunk("aborted"))
        while waiting:
            yield GenerationChunk("", [], [], waiting.popleft().index, "aborted", GenerationStats())

    # ---- helpers --------------------------------------------------------------------------------

    def _chunk(self, seq: LiveSequence, tokens: Sequence[int],
               from_draft: Sequence[bool]) -> GenerationChunk:
        chunk = seq.chunk(self.engine, tokens, from_draft)
        return self._finish(seq, chunk) if chunk.finish_reason else chunk

    def _finish(self, seq: LiveSequence, chunk: GenerationChunk) -> GenerationChunk:
        """Attach the statistics to a sequence's last chunk and free its slot."""
        chunk.stats = seq.close(self.engine)
        del self.live[seq.seq_id]
        return chunk

    def _free_slot(self) -> int:
        return min(set(range(self.n_slots)) - set(self.live))

    def _remove_all(self) -> None:
        for seq_id in list(self.live):
            if self.engine.status(seq_id) != "idle":
                self.engine.remove(seq_id)
        self.live.clear()
