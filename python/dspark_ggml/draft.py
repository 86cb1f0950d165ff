"""DFlash / DSpark drafts: loading against a target, feature injection and block proposals."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import _lib
from ._handle import NativeHandle
from .context import flash_attn_modes, kv_types
from .errors import InvalidArgumentError
from .kv_cache import KVCache
from .model import Model

MARKOV_HEADS = {0: "none", 1: "vanilla", 2: "gated", 3: "rnn"}


@dataclass(frozen=True)
class DraftInfo:
    """What a draft GGUF declares (see ``dspark.h`` ``struct dspark_draft_info``)."""

    block_size: int
    max_draft: int
    target_layers: tuple[int, ...]
    mask_token_id: int
    n_vocab: int
    n_vocab_draft: int
    markov_head: str
    markov_rank: int
    sample_from_anchor: bool
    causal: bool
    has_confidence: bool

    @property
    def kind(self) -> str:
        """"dspark" (Markov head) or "dflash"."""
        return "dflash" if self.markov_head == "none" else "dspark"


class DraftModel(Model):
    """A DFlash / DSpark draft loaded for a target.

    Args:
        path: the draft GGUF (arch ``dflash``).
        target: the target :class:`Model` it drafts for (it borrows the target's embeddings and lm
            head when it has none). May be None only for a draft with its own embeddings and head.
        device, use_mmap: as for :class:`Model`, except that with a target -1 (default) means the
            target's device.
        sample_from_anchor: override the file's block layout (None: as the file says).
        layer_offset: added to every target layer id the file names (default 0). The two overrides
            exist to test a conversion (``dspark-ggml check``).

    Raises:
        InvalidArgumentError: the draft does not fit the target (hidden size, layer ids, vocabulary).
        FileFormatError: a missing key (e.g. the mask token id) or tensor, a bad d2t table.
    """

    def __init__(self, path: str | os.PathLike[str], target: Model | None = None, *, device: int = -1,
                 use_mmap: bool = True, sample_from_anchor: bool | None = None, layer_offset: int = 0) -> None:
        self.path = os.fspath(path)
        self.target = target
        lib, ffi = _lib.lib(), _lib.ffi()
        params = ffi.new("struct dspark_model_params *", lib.dspark_model_default_params())
        params.device, params.use_mmap = device, use_mmap
        params.draft_sample_from_anchor = -1 if sample_from_anchor is None else int(sample_from_anchor)
        params.draft_layer_offset = layer_offset
        tgt = target.handle if target is not None else ffi.NULL
        self._handle = _lib.check_ptr(lib.dspark_draft_load_from_file(self.path.encode(), tgt, params))
        from .gguf_file import GGUFFile

        self.gguf = GGUFFile._borrow(lib.dspark_model_gguf(self._handle), self.path)
        self.info = self._read_info()

    @property
    def confidence_calibrated(self) -> bool:
        """Whether the confidence head was calibrated on held-out data (its per-position temperatures
        are in the GGUF, dflash.confidence_temperatures): a head whose confidences can be taken at
        their word, as the confidence schedule does."""
        return self.info.has_confidence and "dflash.confidence_temperatures" in self.gguf

    def _read_info(self) -> DraftInfo:
        lib, ffi = _lib.lib(), _lib.ffi()
        i = ffi.new("struct dspark_draft_info *")
        _lib.check(lib.dspark_draft_get_info(self._handle, i))
        return DraftInfo(i.block_size, i.max_draft, tuple(i.target_layers[k] for k in range(i.n_target_layers)),
                         i.mask_token_id, i.n_vocab, i.n_vocab_draft, MARKOV_HEADS[i.markov_head], i.markov_rank,
                         bool(i.sample_from_anchor), bool(i.causal), bool(i.has_confidence))


@dataclass
class Proposal:
    """Draft tokens per sequence, block-major. ``confidence``, ``logits`` and ``probs`` may be None."""

    tokens: np.ndarray             # [n_seqs, n_draft] int32 (target vocabulary)
    confidence: np.ndarray | None  # [n_seqs, n_draft] float32
    logits: np.ndarray | None      # [n_seqs, n_draft, n_vocab] float32
    probs: np.ndarray | None = None  # [n_seqs, n_draft] float32: q of each sampled token


class DraftContext(NativeHandle):
    """The draft's KV cache of injected target features, and block proposals.

    Args:
        draft: the :class:`DraftModel`.
        n_ctx: context cells (as the target's; 0 = the draft's training context).
        n_batch: max feature rows per :meth:`inject`. Default 512.
        n_seq_max, n_threads, type_kv, flash_attn: as for :class:`~dspark_ggml.context.Context`.
    """

    _free_function = "dspark_draft_context_free"
    _kind = "draft context"

    def __init__(self, draft: DraftModel, *, n_ctx: int = 0, n_batch: int = 512, n_seq_max: int = 1,
                 n_threads: int | None = None, type_kv: str = "f16", flash_attn: bool | str = "auto",
                 batch_invariant: bool = False) -> None:
        if type_kv not in kv_types():
            raise InvalidArgumentError(f"type_kv must be one of {sorted(kv_types())}, got {type_kv!r}")
        lib, ffi = _lib.lib(), _lib.ffi()
        p = ffi.new("struct dspark_context_params *", lib.dspark_context_default_params())
        p.n_ctx, p.n_batch, p.n_seq_max = n_ctx, n_batch, n_seq_max
        p.n_threads = n_threads or 0
        p.type_kv = kv_types()[type_kv]
        p.flash_attn = flash_attn_modes()[flash_attn]
        p.batch_invariant = bool(batch_invariant)  # as Context's (the server sets both alike)
        self.draft = draft
        self.info = draft.info
        self._handle: Any = _lib.check_ptr(lib.dspark_draft_context_init(draft.handle, p))
        self.n_seq_max = n_seq_max
        self.kv = KVCache(lib.dspark_draft_get_kv(self._handle), n_seq_max, self)
        self._abort_cb: Any = None

    def set_abort_callback(self, callback: Any | None) -> None:
        """Call ``callback()`` during :meth:`inject` and :meth:`propose`; a true result stops them
        (AbortedError, the draft cache unchanged). None removes it."""
        self._set_abort_callback("dspark_draft_set_abort_callback", callback)

    def inject(self, features: np.ndarray, positions: Sequence[int] | np.ndarray, seq_ids: Sequence[int] | np.ndarray | int = 0) -> None:
        """Store target features [n_rows, n_target_layers * n_embd] as context cells."""
        f = np.ascontiguousarray(features, dtype=np.float32)
        if f.ndim != 2:
            raise InvalidArgumentError(f"features must be 2-D [rows, width], got shape {f.shape}")
        n = f.shape[0]
        pos = np.ascontiguousarray(np.broadcast_to(np.asarray(positions, dtype=np.int32), (n,)))
        seq = np.ascontiguousarray(np.broadcast_to(np.asarray(seq_ids, dtype=np.int32), (n,)))
        ffi = _lib.ffi()
        _lib.check(_lib.lib().dspark_draft_inject(self.handle, ffi.from_buffer("float[]", f), n, f.shape[1],
                                                  ffi.from_buffer("int32_t[]", pos), ffi.from_buffer("int32_t[]", seq)))

    def graph_counts(self) -> tuple[int, int]:
        """(propose graphs built, propose graphs reused) so far."""
        ffi = _lib.ffi()
        built, reused = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        _lib.lib().dspark_draft_graph_counts(self.handle, built, reused)
        return int(built[0]), int(reused[0])

    def propose(self, anchors: Sequence[int] | np.ndarray, pos0: Sequence[int] | np.ndarray,
                seq_ids: Sequence[int] | np.ndarray | None = None, *, n_draft: int = 0, want_logits: bool = False,
                temperature: float = 0.0, seed: int = 0, markov_top_k: int = 0) -> Proposal:
        """Propose ``n_draft`` tokens (0 = the most the draft allows) for each sequence.

        Args:
            anchors: the last committed token of each sequence.
            pos0: the position of each anchor (the first position not injected).
            seq_ids: default 0, 1, ... .
            temperature: 0 (default) drafts by argmax; > 0 samples each slot in-graph (inverse CDF
                at one seeded uniform per slot); ``Proposal.probs`` then holds each token's q.
            markov_top_k: > 0 adds the Markov bias to each slot's top-k base candidates only
                (argmax drafting; much cheaper on large vocabularies); 0 (default) = exact.
        """
        a = np.ascontiguousarray(np.atleast_1d(anchors), dtype=np.int32)
        n = len(a)
        p0 = np.ascontiguousarray(np.broadcast_to(np.asarray(pos0, dtype=np.int32), (n,)))
        seq = np.arange(n, dtype=np.int32) if seq_ids is None else np.ascontiguousarray(
            np.broadcast_to(np.asarray(seq_ids, dtype=np.int32), (n,)))
        lib, ffi = _lib.lib(), _lib.ffi()
        pp = ffi.new("struct dspark_propose_params *", lib.dspark_propose_default_params())
        pp.n_draft = n_draft
        pp.markov_top_k = markov_top_k
        pp.want_logits = want_logits
        pp.sample = temperature > 0
        pp.temperature = temperature if temperature > 0 else 1.0
        pp.seed = seed
        _lib.check(lib.dspark_draft_propose(self.handle, n, ffi.from_buffer("int32_t[]", a), ffi.from_buffer("int32_t[]", p0),
                                            ffi.from_buffer("int32_t[]", seq), pp))
        ns, nd = ffi.new("int32_t *"), ffi.new("int32_t *")
        tp = lib.dspark_draft_get_tokens(self.handle, ns, nd)
        shape = (ns[0], nd[0])
        tokens = np.frombuffer(ffi.buffer(tp, shape[0] * shape[1] * 4), dtype=np.int32).reshape(shape).copy()
        cp = lib.dspark_draft_get_confidence(self.handle)
        conf = None if cp == ffi.NULL else np.frombuffer(ffi.buffer(cp, tokens.size * 4), dtype=np.float32).reshape(shape).copy()
        qp = lib.dspark_draft_get_probabilities(self.handle)
        probs = None if qp == ffi.NULL else np.frombuffer(ffi.buffer(qp, tokens.size * 4), dtype=np.float32).reshape(shape).copy()
        lp = lib.dspark_draft_get_logits(self.handle)
        logits = None
        if lp != ffi.NULL:
            V = self.info.n_vocab
            logits = np.frombuffer(ffi.buffer(lp, tokens.size * V * 4), dtype=np.float32).reshape(*shape, V).copy()
        return Proposal(tokens, conf, logits, probs)
