"""/v1/embeddings: pooled hidden states of the target, as llama-server's ``--embeddings``.

An input's embedding is the residual stream entering the target's final norm (captured layer
``n_layer``), mean-pooled over the input's tokens and L2-normalised. It runs in a context of its
own over the target's weights (one sequence, ``--embeddings-ctx`` cells, created at the first
request): the generation engine's KV cache, capture layers and slots are untouched. The work runs
on the engine loop thread between two steps (``Scheduler.call``), one input at a time, so the
device is never driven from two threads and a batch of inputs does not stall the streams for longer
than one input takes.
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np

from ..context import Context

if TYPE_CHECKING:
    from ..llm import LLM

N_BATCH = 512  # tokens per decode; longer inputs are decoded in pieces (the cache holds them all)


class Embedder:
    """Embeddings over ``llm``'s target; :meth:`embed` and :meth:`close` run on one thread.

    Args:
        llm: the loaded LLM (its model must outlive this).
        n_ctx: the longest input in tokens (capped at the LLM's context).
    """

    def __init__(self, llm: LLM, n_ctx: int) -> None:
        self._llm = llm
        self.n_ctx = max(1, min(n_ctx, llm.n_ctx))
        self.n_embd = llm.model.n_embd
        self._ctx: Context | None = None

    def embed(self, tokens: list[int]) -> np.ndarray:
        """The normalised mean of the final norm's input over ``tokens`` (float32, n_embd)."""
        ctx = self._context()
        n = len(tokens)
        total = np.zeros(self.n_embd, dtype=np.float64)
        ctx.kv_clear()
        try:
            for i in range(0, n, ctx.n_batch):
                part = tokens[i:i + ctx.n_batch]
                ctx.decode(part, positions=np.arange(i, i + len(part), dtype=np.int32), seq_ids=0)
                total += ctx.get_captured()[:len(part)].sum(axis=0, dtype=np.float64)
        finally:
            ctx.kv_clear()
        mean = total / max(n, 1)
        norm = float(np.linalg.norm(mean))
        return (mean / norm if norm > 0.0 else mean).astype(np.float32)

    def _context(self) -> Context:
        if self._ctx is None:
            p = self._llm.context.params
            ctx = Context(self._llm.model, n_ctx=self.n_ctx, n_batch=min(N_BATCH, self.n_ctx), n_seq_max=1,
                          n_outputs_max_per_seq=1,  # the logits nobody reads: one row, not n_batch
                          n_threads=p.n_threads, type_kv=p.type_kv, flash_attn=p.flash_attn,
                          batch_invariant=p.batch_invariant)
            try:
                ctx.set_capture_layers([self._llm.model.n_layer])
            except BaseException:
                ctx.close()
                raise
            self._ctx = ctx
        return self._ctx

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


def encode(vector: np.ndarray, as_base64: bool) -> list[float] | str:
    """OpenAI's encodings: a list of floats, or base64 of the little-endian float32 bytes."""
    if as_base64:
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]
