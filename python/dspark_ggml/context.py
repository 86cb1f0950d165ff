"""Target contexts: a KV cache for several sequences, batch decode, logits and captured features."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

import numpy as np

from . import _lib
from ._handle import NativeHandle
from .errors import InvalidArgumentError
from .kv_cache import KVCache
from .model import Model



def kv_types() -> dict[str, int]:
    """KV cache type names and their enum dspark_kv_type values (from the header)."""
    return _lib.enum("KV_TYPE")


def flash_attn_modes() -> dict[Any, int]:
    """flash_attn spellings ("auto", "on", "off", True, False) and their enum dspark_flash_attn values."""
    modes: dict[Any, int] = dict(_lib.enum("FLASH_ATTN"))
    return {**modes, True: modes["on"], False: modes["off"]}


@dataclass(frozen=True)
class ContextParams:
    """The parameters a context runs with (defaults resolved)."""

    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_outputs_max_per_seq: int
    n_threads: int
    type_kv: str
    flash_attn: bool
    batch_invariant: bool


def _int_array(values: Any, n: int, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.int32)
    if a.ndim == 0:
        return np.full(n, int(a), dtype=np.int32)
    a = np.ascontiguousarray(a)
    if a.shape != (n,):
        raise InvalidArgumentError(f"{name} must have one entry per token ({n}), got shape {a.shape}")
    return a


class Context(NativeHandle):
    """A context for a target model: KV cache, compute buffers and outputs.

    Args:
        model: the target :class:`Model` (must outlive the context).
        n_ctx: KV cells shared by all sequences. Default 0 = the model's training context.
        n_batch: max tokens in one :meth:`decode`. Default 512.
        n_seq_max: sequence ids allowed are 0 .. n_seq_max-1 (at most 256). Default 1.
        n_outputs_max_per_seq: max rows of logits one sequence may request in a batch; 0 (default) =
            no limit beyond n_batch. Output buffers are sized from it.
        n_threads: CPU threads; None (default) = all hardware threads.
        type_kv: KV cache type, "f16" (default), "f32", "bf16" or "q8_0".
        flash_attn: "auto" (default: where the device supports it), True or False.
        batch_invariant: a row's results must not depend on the rest of the batch, so a sequence
            decodes to the same logits alone and next to any others. Builds with the CPU attention
            node (AVX2/FMA/F16C) are so already; others switch to ggml's reference kernels (flash
            attention row by row, no fused ops). Default False; a server turns it on.
    """

    _free_function = "dspark_context_free"
    _kind = "context"

    def __init__(self, model: Model, *, n_ctx: int = 0, n_batch: int = 512, n_seq_max: int = 1,
                 n_outputs_max_per_seq: int = 0, n_threads: int | None = None, type_kv: str = "f16",
                 flash_attn: bool | str = "auto", batch_invariant: bool = False) -> None:
        if type_kv not in kv_types():
            raise InvalidArgumentError(f"type_kv must be one of {sorted(kv_types())}, got {type_kv!r}")
        if flash_attn not in flash_attn_modes():
            raise InvalidArgumentError(f"flash_attn must be 'auto', True or False, got {flash_attn!r}")
        for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_seq_max", n_seq_max),
                        ("n_outputs_max_per_seq", n_outputs_max_per_seq)):
            if v < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {v}")
        lib, ffi = _lib.lib(), _lib.ffi()
        p = ffi.new("struct dspark_context_params *", lib.dspark_context_default_params())
        p.n_ctx, p.n_batch, p.n_seq_max = n_ctx, n_batch, n_seq_max
        p.n_outputs_max_per_seq = n_outputs_max_per_seq
        p.n_threads = n_threads or 0
        p.type_kv = kv_types()[type_kv]
        p.flash_attn = flash_attn_modes()[flash_attn]
        p.batch_invariant = bool(batch_invariant)
        self.model = model
        self._handle: Any = _lib.check_ptr(lib.dspark_context_init(model.handle, p))
        self._abort_cb: Any = None
        self.params = self._read_params()
        self.n_vocab = model.n_vocab
        self.n_embd = model.n_embd
        self._capture: tuple[int, ...] = ()
        self.kv = KVCache(lib.dspark_get_kv(self._handle), self.params.n_seq_max, self)

    def _read_params(self) -> ContextParams:
        lib, ffi = _lib.lib(), _lib.ffi()
        p = ffi.new("struct dspark_context_params *")
        lib.dspark_context_get_params(self._handle, p)
        kv_names = {v: k for k, v in kv_types().items()}
        return ContextParams(p.n_ctx, p.n_batch, p.n_seq_max, p.n_outputs_max_per_seq, p.n_threads,
                             kv_names[p.type_kv], p.flash_attn == 1, bool(p.batch_invariant))

    # ---- lifetime ---------------------------------------------------------------------------------

    # ---- settings ---------------------------------------------------------------------------------

    n_ctx = property(attrgetter("params.n_ctx"))
    n_batch = property(attrgetter("params.n_batch"))
    n_seq_max = property(attrgetter("params.n_seq_max"))

    def set_threads(self, n_threads: int) -> None:
        _lib.check(_lib.lib().dspark_context_set_threads(self.handle, n_threads))

    def set_abort_callback(self, callback: Any | None) -> None:
        """Call ``callback()`` during computation; a true result stops it (AbortedError, KV unchanged)."""
        self._set_abort_callback("dspark_context_set_abort_callback", callback)

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Capture the residual stream entering these layers for every token of later batches."""
        ids = np.ascontiguousarray(list(layer_ids), dtype=np.int32)
        ffi = _lib.ffi()
        _lib.check(_lib.lib().dspark_set_capture_layers(self.handle, ffi.from_buffer("int32_t[]", ids), len(ids)))
        self._capture = tuple(int(i) for i in ids)

    # ---- decode -------------------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int] | np.ndarray, positions: Sequence[int] | np.ndarray | None = None,
               seq_ids: Sequence[int] | np.ndarray | int = 0, outputs: Sequence[bool] | np.ndarray | None = None) -> None:
        """Run the target on a batch.

        Args:
            tokens: token ids.
            positions: one per token; default: continue sequence ``seq_ids`` after its cached tokens
                (only when all tokens belong to one sequence).
            seq_ids: one per token, or one id for all. Default 0.
            outputs: which tokens produce logits; default only the last token.

        Raises:
            InvalidArgumentError: a token outside the vocabulary, a position beyond n_ctx or not after
                the cached ones, a sequence id >= n_seq_max, a batch over n_batch, too many outputs.
            ContextFullError: no free KV cells. In every failure the KV cache is unchanged.
        """
        tok = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        n = len(tok)
        if n == 0:
            raise InvalidArgumentError("empty batch")
        seq = _int_array(seq_ids, n, "seq_ids")
        if positions is None:
            if len(np.unique(seq)) != 1:
                raise InvalidArgumentError("positions are required when the batch mixes sequences")
            start = self.kv_seq_pos_max(int(seq[0])) + 1
            pos = np.arange(start, start + n, dtype=np.int32)
        else:
            pos = _int_array(positions, n, "positions")
        lib, ffi = _lib.lib(), _lib.ffi()
        out_arr = None
        if outputs is not None:
            out_arr = np.ascontiguousarray(outputs, dtype=np.int8).reshape(-1)
            if out_arr.shape != (n,):
                raise InvalidArgumentError(f"outputs must have one entry per token ({n})")
        b = ffi.new("struct dspark_batch *")
        b.n_tokens = n
        b.token = ffi.from_buffer("int32_t[]", tok)
        b.pos = ffi.from_buffer("int32_t[]", pos)
        b.seq_id = ffi.from_buffer("int32_t[]", seq)
        b.output = ffi.from_buffer("int8_t[]", out_arr) if out_arr is not None else ffi.NULL
        _lib.check(lib.dspark_decode(self.handle, b))

    @property
    def n_outputs(self) -> int:
        return int(_lib.lib().dspark_n_outputs(self.handle))

    def get_logits(self, *, copy: bool = False) -> np.ndarray:
        """Logits of the last decode, [n_outputs, n_vocab], rows in batch order of the flagged tokens.

        Without ``copy`` this is a view of the context's buffer: valid until the next decode.
        """
        ffi = _lib.ffi()
        n = self.n_outputs
        ptr = _lib.lib().dspark_get_logits(self.handle)
        a = np.frombuffer(ffi.buffer(ptr, n * self.n_vocab * 4), dtype=np.float32).reshape(n, self.n_vocab)
        return a.copy() if copy else a

    def get_captured(self, *, copy: bool = False) -> np.ndarray:
        """Captured features of the last decode, [n_tokens, len(layers) * n_embd] (view unless copy)."""
        ffi = _lib.ffi()
        nt, w = ffi.new("int32_t *"), ffi.new("int32_t *")
        ptr = _lib.lib().dspark_get_captured(self.handle, nt, w)
        a = np.frombuffer(ffi.buffer(ptr, nt[0] * w[0] * 4), dtype=np.float32).reshape(nt[0], w[0])
        return a.copy() if copy else a

    # ---- KV cache ---------------------------------------------------------------------------------

    def graph_counts(self) -> tuple[int, int]:
        """(decode graphs built, decode graphs reused) so far."""
        ffi = _lib.ffi()
        built, reused = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        _lib.lib().dspark_context_graph_counts(self.handle, built, reused)
        return int(built[0]), int(reused[0])

    def kv_seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence (p1 < 0: to the end; seq_id -1: all sequences)."""
        self.kv.seq_rm(seq_id, p0, p1)

    def kv_seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Share positions [p0, p1) of ``src`` with ``dst`` (no copy of data)."""
        self.kv.seq_cp(src, dst, p0, p1)

    def kv_seq_keep(self, seq_id: int) -> None:
        self.kv.seq_keep(seq_id)

    def kv_clear(self) -> None:
        self.kv.clear()

    def kv_seq_pos_max(self, seq_id: int) -> int:
        """Largest cached position of a sequence, -1 if none."""
        return self.kv.seq_pos_max(seq_id)

    def kv_seq_pos_min(self, seq_id: int) -> int:
        return self.kv.seq_pos_min(seq_id)

    @property
    def kv_n_used(self) -> int:
        return self.kv.n_used
