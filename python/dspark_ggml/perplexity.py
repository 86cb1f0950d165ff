"""Perplexity and KL divergence, computed the way llama.cpp's ``llama-perplexity`` computes them.

Perplexity: the text is tokenized once (BOS in front when the model's tokenizer adds one, no EOS,
control-token text not parsed), cut into chunks of ``n_ctx`` tokens (the tail that does not fill a
chunk is dropped) and each chunk is decoded from an empty KV cache, its first token replaced by BOS
when the model adds one. Only the second half of a chunk is scored: the rows of positions
``n_ctx//2 .. n_ctx-2`` predict the tokens after them, so every scored token sees at least half a
context. PPL = exp(mean NLL) over all scored tokens; its uncertainty is PPL times the standard error
of the mean NLL.

KL divergence: a *base* file holds a reference model's log-probabilities of the scored positions,
in llama-perplexity's format (``--kl-divergence-base``), so that either program reads what the
other wrote. Its layout, all little-endian:

=================  =========================================================================
``_logits_``       8 bytes, the magic
n_ctx              int32
n_vocab            int32
n_chunk            int32
tokens             int32 × n_chunk·n_ctx: the text's tokens as tokenized (chunk-first BOS not
                   substituted)
per chunk          n_ctx−1−n_ctx/2 rows of ``2·⌈n_vocab/2⌉ + 4`` uint16 each: the float32 pair
                   (scale, min_log_prob) in the first 4 (8 bytes), then one uint16 q per token
                   id, then a zero pad to an even count
=================  =========================================================================

A row stores log p(i) ≈ scale·q[i] + min_log_prob: with m the largest logit, lo = max(smallest
logit, m − 16), ``scale = (m − lo)/65535`` and ``min_log_prob = lo − m − log Σ exp(l − m)``;
q[i] = round-half-even((l[i] − lo)/scale) for logits above lo, else 0 (all in float32, so rows we
write are the bytes llama-perplexity writes for the same logits).

With a base file, :func:`kl_divergence` decodes the same chunks and reports, per scored position,
KL(base ‖ model) (summed over the ids whose base log-prob is above −16), Δp = p_model(next token) −
p_base(next token) and whether both put their maximum on the same id, with the statistics
llama-perplexity prints (means with their uncertainties, percentiles, PPL of both and their ratio).
"""
from __future__ import annotations

import math
import os
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np

from .errors import FileAccessError, FileFormatError, InvalidArgumentError
from .tokenizer import Tokenizer

BASE_MAGIC = b"_logits_"
_HEADER = struct.Struct("<8siii")        # magic, n_ctx, n_vocab, n_chunk
_LOG_PROB_FLOOR = -16.0                  # base log-probs at or below this add nothing to the KLD
_ROW_BLOCK = 32                          # rows per vectorised block (bounds the temporaries)

# the percentiles llama-perplexity prints (fractions), highest first
KLD_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.10, 0.05, 0.01, 0.001)
DP_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.75, 0.25, 0.10, 0.05, 0.01, 0.001)


# ---- shapes ------------------------------------------------------------------------------------

def first_scored(n_ctx: int) -> int:
    """Position of a chunk's first scored row."""
    return n_ctx // 2


def n_scored(n_ctx: int) -> int:
    """Scored positions per chunk (rows n_ctx/2 .. n_ctx-2, each predicting the next token)."""
    return n_ctx - 1 - n_ctx // 2


def row_width(n_vocab: int) -> int:
    """uint16 values per compressed row: 4 (the float32 scale and min_log_prob), then n_vocab
    rounded up to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _check_n_ctx(n_ctx: int) -> None:
    if n_ctx < 4:
        raise InvalidArgumentError(f"the context (-c) must be at least 4 tokens (half of it is scored), "
                                   f"got {n_ctx}")


# ---- text --------------------------------------------------------------------------------------

def read_text(path: str | os.PathLike[str]) -> str:
    """A text file as llama.cpp's ``-f`` reads it: the bytes as they are (no newline translation),
    less one final newline."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileAccessError(f"{path}: no such text file") from None
    except OSError as e:
        raise FileAccessError(f"{path}: cannot read the text file: {e.strerror or e}") from None
    if data.endswith(b"\n"):
        data = data[:-1]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{path} is not UTF-8 text (byte {e.start})") from None
    if not text:
        raise InvalidArgumentError(f"{path} is empty: there is no text to evaluate")
    return text


def tokenize(tokenizer: Any, text: str) -> np.ndarray:
    """Token ids of a whole text as llama-perplexity tokenizes it: BOS first when the model adds one,
    never EOS, control tokens written in the text not recognised."""
    if not text:
        raise InvalidArgumentError("the text is empty: there is nothing to evaluate")
    ids = tokenizer.encode(text, add_special=False, parse_special=False)
    bos = _bos_of(tokenizer)
    if bos is not None:
        ids = [bos, *ids]
    return np.asarray(ids, dtype=np.int32)


def _bos_of(tokenizer: Any) -> int | None:
    """The token that starts each chunk, or None when the model adds no BOS."""
    if tokenizer is None or not tokenizer.add_bos or tokenizer.bos_id is None:
        return None
    return int(tokenizer.bos_id)




# ---- log-softmax and the compressed rows ---------------------------------------------------------

def _as_rows(logits: np.ndarray) -> np.ndarray:
    a = np.asarray(logits, dtype=np.float32)
    if a.ndim != 2:
        raise InvalidArgumentError(f"logits must be [rows, n_vocab], got shape {a.shape}")
    return a


def _max_and_lse(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: (largest logit, log Σ exp(l − max) as float64, first index of the maximum)."""
    mx = logits.max(axis=1)
    s = np.exp(logits - mx[:, None]).sum(axis=1, dtype=np.float64)
    return mx, np.log(s), logits.argmax(axis=1)


def nll_of(logits: np.ndarray, next_tokens: Sequence[int] | np.ndarray, *,
           float32: bool = False) -> np.ndarray:
    """−log softmax(logits)[next token] per row, float64 (rows in blocks; no loop over the vocabulary).

    ``float32``: round it as llama-perplexity does while it writes a base file (max + log Σ in
    float32; 1e-7 from the exact value), so that the PPL printed then is the same to the last digit.
    """
    logits = _as_rows(logits)
    nxt = np.asarray(next_tokens, dtype=np.int64)
    out = np.empty(len(logits), dtype=np.float64)
    for b in range(0, len(logits), _ROW_BLOCK):
        blk = logits[b:b + _ROW_BLOCK]
        mx, lse, _ = _max_and_lse(blk)
        picked = blk[np.arange(len(blk)), nxt[b:b + _ROW_BLOCK]]
        if float32:
            out[b:b + _ROW_BLOCK] = (mx + lse.astype(np.float32)) - picked
        else:
            out[b:b + _ROW_BLOCK] = mx.astype(np.float64) + lse - picked.astype(np.float64)
    return out


def compress_log_probs(logits: np.ndarray) -> np.ndarray:
    """Rows of the base file for these logits, uint16 [rows, row_width(n_vocab)] (see the module doc)."""
    logits = _as_rows(logits)
    n, n_vocab = logits.shape
    out = np.zeros((n, row_width(n_vocab)), dtype=np.uint16)
    f32 = np.float32
    for b in range(0, n, _ROW_BLOCK):
        blk = logits[b:b + _ROW_BLOCK]
        mx, lse64, _ = _max_and_lse(blk)
        lo = np.maximum(blk.min(axis=1), mx - f32(16))
        lse = lse64.astype(f32)
        min_log_prob = (lo - mx) - lse
        scale = (mx - lo) / f32(65535)
        head = np.stack([scale, min_log_prob], axis=1).astype(f32)
        out[b:b + len(blk), :4] = head.view(np.uint16).reshape(len(blk), 4)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inv = np.where(scale != 0, f32(1) / scale, f32(0)).astype(f32)
            q = np.rint((blk - lo[:, None]) * inv[:, None])
        q = np.where(blk > lo[:, None], q, f32(0))
        q[scale == 0] = 0
        # the wrap llama.cpp's store into uint16 has (a value rounding to 65536 becomes 0)
        out[b:b + len(blk), 4:4 + n_vocab] = (q.astype(np.int64) & 0xFFFF).astype(np.uint16)
    return out


def decompress_log_probs(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """Base-file rows back to log-probabilities, float32 [rows, n_vocab]."""
    rows = np.asarray(rows, dtype=np.uint16)
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    scale, min_log_prob = head[:, 0], head[:, 1]
    return scale[:, None] * rows[:, 4:4 + n_vocab].astype(np.float32) + min_log_prob[:, None]


# ---- statistics --------------------------------------------------------------------------------

def _mean_and_err(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean and standard error as llama-perplexity's KLD statistics give them (no error for 10 values
    or fewer)."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    var = total2 / count - mean * mean
    return mean, (math.sqrt(var / (count - 1)) if var > 0 and count > 10 else 0.0)


def _covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Linear interpolation between the two nearest ranks of a sorted array, as llama-perplexity."""
    v = sorted_values
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = fraction * (len(v) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)])


def _median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2 == 0:
        return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))
    return float(sorted_values[n // 2])


def _ppl_and_err(nll: np.ndarray) -> tuple[float, float]:
    """exp(mean NLL) and its uncertainty as llama-perplexity's final estimate (NaN when undefined)."""
    count = len(nll)
    if count == 0:
        return math.nan, math.nan
    mean = float(nll.sum()) / count
    var = float((nll * nll).sum()) / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else math.nan
    return ppl, err


# ---- results -----------------------------------------------------------------------------------

@dataclass
class PerplexityResult:
    """What :func:`perplexity` measured.

    ``nll`` holds the negative log-likelihood of each scored token, chunk by chunk; ``chunk_ppl`` the
    running PPL after each chunk (llama-perplexity's ``[i]ppl`` line).
    """

    ppl: float
    ppl_err: float
    n_ctx: int
    n_chunk: int
    n_tokens: int
    nll: np.ndarray
    chunk_ppl: list[float]
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return len(self.nll)

    def to_dict(self) -> dict[str, Any]:
        return {"ppl": self.ppl, "ppl_err": _finite(self.ppl_err), "n_ctx": self.n_ctx,
                "n_chunk": self.n_chunk, "n_tokens": self.n_tokens, "count": self.count,
                "chunk_ppl": self.chunk_ppl, "seconds": self.seconds}


@dataclass
class KLDivergenceResult:
    """Statistics of :func:`kl_divergence`; Δp and same-top values are fractions (not %).

    ``kld`` and ``dp`` hold the per-position values, sorted ascending.
    """

    count: int
    n_ctx: int
    n_chunk: int
    ppl: float
    ppl_err: float
    ppl_base: float
    ppl_base_err: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    ppl_ratio: float
    ppl_ratio_err: float
    ppl_diff: float
    ppl_diff_err: float
    ln_ppl_cor: float
    kld_mean: float
    kld_err: float
    kld_median: float
    kld_max: float
    kld_min: float
    dp_mean: float
    dp_err: float
    dp_median: float
    dp_max: float
    dp_min: float
    rms_dp: float
    rms_dp_err: float
    same_top_p: float
    same_top_p_err: float
    kld: np.ndarray = field(repr=False)
    dp: np.ndarray = field(repr=False)
    chunks: list[dict[str, float]] = field(default_factory=list, repr=False)
    seconds: float = 0.0

    def kld_percentile(self, fraction: float) -> float:
        return percentile(self.kld, fraction)

    def dp_percentile(self, fraction: float) -> float:
        return percentile(self.dp, fraction)

    def to_dict(self) -> dict[str, Any]:
        names = ("count", "n_ctx", "n_chunk", "ppl", "ppl_err", "ppl_base", "ppl_base_err", "ln_ppl_ratio",
                 "ln_ppl_ratio_err", "ppl_ratio", "ppl_ratio_err", "ppl_diff", "ppl_diff_err", "ln_ppl_cor",
                 "kld_mean", "kld_err", "kld_median", "kld_max", "kld_min", "dp_mean", "dp_err", "dp_median",
                 "dp_max", "dp_min", "rms_dp", "rms_dp_err", "same_top_p", "same_top_p_err", "seconds")
        d: dict[str, Any] = {n: _finite(getattr(self, n)) for n in names}
        d["kld_percentiles"] = {f"{100 * f:g}": self.kld_percentile(f) for f in KLD_PERCENTILES}
        d["dp_percentiles"] = {f"{100 * f:g}": self.dp_percentile(f) for f in DP_PERCENTILES}
        d["chunks"] = self.chunks
        return d


def _finite(v: Any) -> Any:
    """NaN and infinities as None (JSON has neither)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class KLDivergenceStats:
    """Running sums of the KLD statistics (llama-perplexity's), fed a chunk at a time."""

    def __init__(self) -> None:
        self.sum_nll = self.sum_nll2 = 0.0
        self.sum_nll_base = self.sum_nll_base2 = self.sum_nll_nll_base = 0.0
        self.sum_kld = self.sum_kld2 = 0.0
        self.sum_dp = self.sum_dp2 = self.sum_dp4 = 0.0
        self.n_same_top = 0
        self.count = 0
        self._kld: list[np.ndarray] = []
        self._dp: list[np.ndarray] = []

    def add(self, logits: np.ndarray, next_tokens: np.ndarray, base_rows: np.ndarray) -> None:
        """Score rows of logits against the base file's rows for the same positions."""
        logits = _as_rows(logits)
        n, n_vocab = logits.shape
        base_rows = np.asarray(base_rows)
        nxt = np.asarray(next_tokens, dtype=np.int64)
        if base_rows.shape[0] != n or len(nxt) != n:
            raise InvalidArgumentError(f"{n} rows of logits, {base_rows.shape[0]} base rows, "
                                       f"{len(nxt)} tokens")
        f32 = np.float32
        for b in range(0, n, _ROW_BLOCK):
            blk = logits[b:b + _ROW_BLOCK]
            rows = np.arange(len(blk))
            tok = nxt[b:b + _ROW_BLOCK]
            mx, lse64, imax = _max_and_lse(blk)
            shift = mx + lse64.astype(f32)                       # log Σ exp(l), float32
            nll = (shift - blk[rows, tok]).astype(f32)
            base = decompress_log_probs(base_rows[b:b + _ROW_BLOCK], n_vocab)
            nll_base = -base[rows, tok]
            live = base > f32(_LOG_PROB_FLOOR)
            with np.errstate(under="ignore"):
                terms = np.exp(base) * ((base - blk) + shift[:, None])
            kld = np.where(live, terms, f32(0)).sum(axis=1, dtype=np.float64)
            dp = (np.exp(-nll) - np.exp(-nll_base)).astype(f32)
            imax_base = base.argmax(axis=1)
            # products of float32 values are float32 (as llama.cpp's), sums are float64
            f64 = np.float64
            dp2 = (dp * dp).astype(f64)
            self.sum_nll += float(nll.sum(dtype=f64))
            self.sum_nll2 += float((nll * nll).sum(dtype=f64))
            self.sum_nll_base += float(nll_base.sum(dtype=f64))
            self.sum_nll_base2 += float((nll_base * nll_base).sum(dtype=f64))
            self.sum_nll_nll_base += float((nll * nll_base).sum(dtype=f64))
            self.sum_kld += float(kld.sum())
            self.sum_kld2 += float((kld * kld).sum())
            self.sum_dp += float(dp.sum(dtype=f64))
            self.sum_dp2 += float(dp2.sum())
            self.sum_dp4 += float((dp2 * dp2).sum())
            self.n_same_top += int((imax == imax_base).sum())
            self.count += len(blk)
            self._kld.append(kld.astype(f32))
            self._dp.append(dp)

    # llama-perplexity's per-chunk line: PPL, ln(PPL/PPL base), KLD, RMS Δp, same top
    def running(self) -> dict[str, float]:
        r = self._summary_numbers()
        return {k: r[k] for k in ("ppl", "ppl_err", "ln_ppl_ratio", "ln_ppl_ratio_err", "kld_mean", "kld_err",
                                  "rms_dp", "rms_dp_err", "same_top_p", "same_top_p_err")}

    def _summary_numbers(self) -> dict[str, float]:
        c = self.count
        log_ppl, log_ppl_err = _mean_and_err(self.sum_nll, self.sum_nll2, c)
        log_base, log_base_err = _mean_and_err(self.sum_nll_base, self.sum_nll_base2, c)
        cov = _covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, c)
        ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
        ppl_err, ppl_base_err = ppl * log_ppl_err, ppl_base * log_base_err
        ratio_err = math.sqrt(max(log_ppl_err ** 2 + log_base_err ** 2 - 2 * cov, 0.0))
        denom = log_ppl_err * log_base_err
        kld, kld_err = _mean_and_err(self.sum_kld, self.sum_kld2, c)
        mse, mse_err = _mean_and_err(self.sum_dp2, self.sum_dp4, c)
        rms = math.sqrt(mse)
        same = self.n_same_top / c if c else math.nan
        return {
            "ppl": ppl, "ppl_err": ppl_err, "ppl_base": ppl_base, "ppl_base_err": ppl_base_err,
            "ln_ppl_cor": cov / denom if denom > 0 else math.nan,
            "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_err": ratio_err,
            "ppl_ratio": math.exp(log_ppl - log_base),
            "ppl_ratio_err": math.exp(log_ppl - log_base) * ratio_err,
            "ppl_diff": ppl - ppl_base,
            "ppl_diff_err": math.sqrt(max(ppl_err ** 2 + ppl_base_err ** 2 - 2 * ppl * ppl_base * cov, 0.0)),
            "kld_mean": kld, "kld_err": kld_err,
            "rms_dp": rms, "rms_dp_err": 0.5 / rms * mse_err if rms > 0 else 0.0,
            "same_top_p": same,
            "same_top_p_err": math.sqrt(same * (1 - same) / (c - 1)) if c > 1 else math.nan,
        }

    def result(self, n_ctx: int, n_chunk: int, chunks: list[dict[str, float]] | None = None,
               seconds: float = 0.0) -> KLDivergenceResult:
        if self.count == 0:
            raise InvalidArgumentError("no positions were scored")
        r = self._summary_numbers()
        kld = np.sort(np.concatenate(self._kld))
        dp = np.sort(np.concatenate(self._dp))
        dp_mean, dp_err = _mean_and_err(self.sum_dp, self.sum_dp2, self.count)
        return KLDivergenceResult(
            count=self.count, n_ctx=n_ctx, n_chunk=n_chunk, **r,
            kld_median=_median(kld), kld_max=float(kld[-1]), kld_min=float(kld[0]),
            dp_mean=dp_mean, dp_err=dp_err, dp_median=_median(dp), dp_max=float(dp[-1]), dp_min=float(dp[0]),
            kld=kld, dp=dp, chunks=list(chunks or []), seconds=seconds)


# ---- the base file -------------------------------------------------------------------------------

class BaseFile:
    """A KL-divergence base file (llama-perplexity's ``--kl-divergence-base``), read-only and mapped.

    Attributes: n_ctx, n_vocab, n_chunk, tokens (int32 [n_chunk·n_ctx]); :meth:`rows` gives one
    chunk's compressed rows, :meth:`log_probs` the same as float32 log-probabilities.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(_HEADER.size)
        except FileNotFoundError:
            raise FileAccessError(f"{self.path}: no such KL-divergence base file") from None
        except OSError as e:
            raise FileAccessError(f"{self.path}: cannot read the KL-divergence base file: "
                                  f"{e.strerror or e}") from None
        if len(head) < len(BASE_MAGIC) or head[:len(BASE_MAGIC)] != BASE_MAGIC:
            raise FileFormatError(f"{self.path} is not a KL-divergence base file (no '_logits_' magic)")
        if len(head) < _HEADER.size:
            raise FileFormatError(f"{self.path} is truncated: {size} bytes, not even the 20-byte header")
        _, self.n_ctx, self.n_vocab, self.n_chunk = _HEADER.unpack(head)
        if self.n_ctx < 4 or self.n_vocab < 1 or self.n_chunk < 1:
            raise FileFormatError(f"{self.path}: bad header (n_ctx={self.n_ctx}, n_vocab={self.n_vocab}, "
                                  f"n_chunk={self.n_chunk})")
        self.n_scored = n_scored(self.n_ctx)
        self.row_width = row_width(self.n_vocab)
        n_tok = self.n_ctx * self.n_chunk
        self._rows_offset = _HEADER.size + 4 * n_tok
        expected = self._rows_offset + 2 * self.n_chunk * self.n_scored * self.row_width
        if size != expected:
            what = "is truncated" if size < expected else "has extra bytes"
            raise FileFormatError(f"{self.path} {what}: {size} bytes where n_ctx={self.n_ctx}, "
                                  f"n_vocab={self.n_vocab}, n_chunk={self.n_chunk} make {expected}")
        self.tokens = np.fromfile(self.path, dtype="<i4", count=n_tok, offset=_HEADER.size).astype(np.int32)
        bad = np.flatnonzero((self.tokens < 0) | (self.tokens >= self.n_vocab))
        if len(bad):
            raise FileFormatError(f"{self.path}: token {int(self.tokens[bad[0]])} at {int(bad[0])} is "
                                  f"outside its vocabulary of {self.n_vocab}")
        self._rows = np.memmap(self.path, dtype="<u2", mode="r", offset=self._rows_offset,
                               shape=(self.n_chunk, self.n_scored, self.row_width))

    def rows(self, chunk: int) -> np.ndarray:
        """Compressed rows of one chunk, uint16 [n_scored, row_width] (a view of the mapped file)."""
        return self._rows[chunk]

    def log_probs(self, chunk: int) -> np.ndarray:
        return decompress_log_probs(self.rows(chunk), self.n_vocab)

    def close(self) -> None:
        """Drop the mapping; it is unmapped once no array from :meth:`rows` is left (closing it under
        a live view would crash whoever reads the view)."""
        self._rows = None  # type: ignore[assignment]

    def __enter__(self) -> "BaseFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_base(path: str | os.PathLike[str]) -> BaseFile:
    return BaseFile(path)


class BaseFileWriter:
    """Writes a base file chunk by chunk, through a temporary file renamed at :meth:`close` (a failed
    or interrupted run leaves no half-written file)."""

    def __init__(self, path: str | os.PathLike[str], n_ctx: int, n_vocab: int, n_chunk: int,
                 tokens: np.ndarray) -> None:
        self.path = os.fspath(path)
        self.n_ctx, self.n_vocab, self.n_chunk = n_ctx, n_vocab, n_chunk
        self._tmp = self.path + ".part"
        self._written = 0
        toks = np.asarray(tokens, dtype="<i4")[:n_ctx * n_chunk]
        if len(toks) != n_ctx * n_chunk:
            raise InvalidArgumentError(f"{len(toks)} tokens for {n_chunk} chunks of {n_ctx}")
        try:
            self._f: BinaryIO | None = open(self._tmp, "wb")
        except OSError as e:
            raise FileAccessError(f"{self.path}: cannot write the KL-divergence base file: "
                                  f"{e.strerror or e}") from None
        self._f.write(_HEADER.pack(BASE_MAGIC, n_ctx, n_vocab, n_chunk))
        self._f.write(toks.tobytes())

    def add_chunk(self, logits: np.ndarray) -> None:
        """The logits of one chunk's scored rows, [n_scored, n_vocab]."""
        assert self._f is not None
        if logits.shape != (n_scored(self.n_ctx), self.n_vocab):
            raise InvalidArgumentError(f"a chunk has {n_scored(self.n_ctx)} scored rows of {self.n_vocab} "
                                       f"logits, got {logits.shape}")
        self._f.write(compress_log_probs(logits).astype("<u2").tobytes())
        self._written += 1

    def close(self) -> None:
        if self._f is None:
            return
        self._f.close()
        self._f = None
        if self._written != self.n_chunk:
            os.unlink(self._tmp)
            raise InvalidArgumentError(f"{self.path}: {self._written} of {self.n_chunk} chunks written")
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
            try:
                os.unlink(self._tmp)
            except OSError:
                pass


# ---- decoding the chunks -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    n_ctx: int
    n_chunk: int
    n_batch: int      # tokens per decode
    n_seq: int        # chunks decoded side by side


def _plan(n_ctx: int, n_chunk: int, n_batch: int | None) -> _Plan:
    """llama-perplexity's batching: n_batch >= n_ctx decodes n_batch // n_ctx chunks side by side in
    one batch; a smaller n_batch decodes each chunk in several batches."""
    n_batch = n_ctx if n_batch is None else int(n_batch)
    if n_batch < 1:
        raise InvalidArgumentError(f"the batch size (-b) must be >= 1, got {n_batch}")
    if n_batch >= n_ctx:
        n_seq = max(1, min(n_batch // n_ctx, n_chunk, 256))
        return _Plan(n_ctx, n_chunk, n_ctx, n_seq)
    return _Plan(n_ctx, n_chunk, n_batch, 1)


def _chunk_logits(ctx: Any, plan: _Plan, tokens: np.ndarray,
                  bos: int | None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(chunk index, logits of its scored rows [n_scored, n_vocab], the tokens they predict) for each
    chunk in order. The logits may be a view of the context's buffer: use them before the next item."""
    n_ctx = plan.n_ctx
    first, n_sc = first_scored(n_ctx), n_scored(n_ctx)
    n_decodes = (n_ctx + plan.n_batch - 1) // plan.n_batch
    for i in range(0, plan.n_chunk, plan.n_seq):
        n_here = min(plan.n_seq, plan.n_chunk - i)
        ctx.kv_clear()
        parts: list[list[np.ndarray]] = [[] for _ in range(n_here)]
        single: np.ndarray | None = None
        for j in range(n_decodes):
            b0 = j * plan.n_batch
            size = min(n_ctx - b0, plan.n_batch)
            pos = np.arange(b0, b0 + size, dtype=np.int32)
            want = (pos >= first) & (pos < n_ctx - 1)
            toks = []
            for s in range(n_here):
                start = (i + s) * n_ctx
                t = tokens[start + b0:start + b0 + size].copy()
                if bos is not None and j == 0:
                    t[0] = bos
                toks.append(t)
            ctx.decode(np.concatenate(toks), positions=np.tile(pos, n_here),
                       seq_ids=np.repeat(np.arange(n_here, dtype=np.int32), size),
                       outputs=np.tile(want, n_here))
            k = int(want.sum())
            if k == 0:
                continue
            logits = ctx.get_logits()
            if n_decodes == 1:
                single = logits
            else:
                for s in range(n_here):
                    parts[s].append(logits[s * k:(s + 1) * k].copy())
        for s in range(n_here):
            start = (i + s) * n_ctx
            rows = single[s * n_sc:(s + 1) * n_sc] if single is not None else np.concatenate(parts[s])
            yield i + s, rows, tokens[start + first + 1:start + n_ctx]


@contextmanager
def _ctrl_c_stops(ctx: Any) -> Iterator[None]:
    """Ctrl-C stops a decode in the middle (through the context's abort callback) and raises
    KeyboardInterrupt, instead of waiting for the decode of a whole chunk to end."""
    from .errors import AbortedError
    from .interrupt import Interrupt

    stop = Interrupt()
    ctx.set_abort_callback(stop.is_set)
    try:
        with stop.catching_sigint():
            yield
            if stop.by_signal:
                raise KeyboardInterrupt
    except AbortedError:
        if stop.by_signal:
            raise KeyboardInterrupt from None
        raise
    finally:
        ctx.set_abort_callback(None)


def _open_model(model: Any, **model_options: Any) -> Any:
    from .model import Model

    if isinstance(model, Model):
        return model
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise FileAccessError(f"{path}: no such model file")
    return Model(path, **model_options)


def _check_ctx_train(model: Any, n_ctx: int) -> None:
    if n_ctx > model.n_ctx_train:
        raise InvalidArgumentError(f"the context (-c {n_ctx}) is larger than "
                                   f"{os.path.basename(model.path)}'s training context ({model.n_ctx_train})")


def _context(model: Any, plan: _Plan, n_threads: int | None, type_kv: str, flash_attn: Any) -> Any:
    from .context import Context

    _check_ctx_train(model, plan.n_ctx)
    return Context(model, n_ctx=plan.n_ctx * plan.n_seq, n_batch=plan.n_batch * plan.n_seq,
                   n_seq_max=plan.n_seq, n_threads=n_threads, type_kv=type_kv, flash_attn=flash_attn)


def _progress_bar(total: int, desc: str, progress: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="chunk", disable=(None if progress is None else not progress),
                leave=False, dynamic_ncols=True)


def _resolve_bos(bos: Any, model: Any) -> tuple[int | None, Any]:
    """(BOS id or None, tokenizer or None): "auto" asks the model's tokenizer."""
    if bos != "auto":
        return (None if bos is None else int(bos)), None
    tok = Tokenizer.from_gguf_if_any(model.path)
    return _bos_of(tok), tok


def _tokens_of(model: Any, text: str | None, tokens: Any, tokenizer: Any) -> np.ndarray:
    if (text is None) == (tokens is None):
        raise InvalidArgumentError("pass exactly one of text and tokens")
    if tokens is not None:
        return np.asarray(tokens, dtype=np.int32).reshape(-1)
    if tokenizer is None:
        tokenizer = Tokenizer.from_gguf_if_any(model.path)
        if tokenizer is None:
            raise InvalidArgumentError(f"{model.path} has no tokenizer: pass token ids")
    return tokenize(tokenizer, text)  # type: ignore[arg-type]


# ---- entry points --------------------------------------------------------------------------------

def perplexity(model: Any, text: str | None = None, *, tokens: Sequence[int] | np.ndarray | None = None,
               n_ctx: int = 512, n_batch: int | None = None, n_chunks: int | None = None,
               n_threads: int | None = None, type_kv: str = "f16", flash_attn: Any = "auto",
               bos: int | None | str = "auto", kl_divergence_base: str | os.PathLike[str] | None = None,
               progress: bool | None = False,
               on_chunk: Callable[[int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of a model on a text (or its tokens), as llama-perplexity computes it by default.

    Args:
        model: a :class:`~dspark_ggml.Model` or the path of a GGUF.
        text / tokens: what to evaluate; tokens are used as given (include the BOS yourself).
        n_ctx: tokens per chunk (llama.cpp's ``-c``, default 512).
        n_batch: tokens per decode; >= n_ctx decodes n_batch // n_ctx chunks together. Default n_ctx.
        n_chunks: evaluate at most this many chunks (default: all).
        bos: the token put first in every chunk; "auto" (default): the model's BOS if its tokenizer
            adds one, else none.
        kl_divergence_base: also write the log-probs of the scored positions to this base file.
        progress: a tqdm bar on stderr (None: when stderr is a terminal).
        on_chunk: called with (chunks done, running PPL) after each chunk.

    Raises:
        InvalidArgumentError: empty text, fewer than 2·n_ctx tokens, n_ctx above the training context.
    """
    import time

    _check_n_ctx(n_ctx)
    model = _open_model(model)
    _check_ctx_train(model, n_ctx)
    bos_id, tok = _resolve_bos(bos, model)
    ids = _tokens_of(model, text, tokens, tok)
    if len(ids) == 0:
        raise InvalidArgumentError("the text has no tokens: there is nothing to evaluate")
    if len(ids) < 2 * n_ctx:
        raise InvalidArgumentError(f"the text has {len(ids)} tokens; a context of {n_ctx} (-c) needs at "
                                   f"least {2 * n_ctx} (2 chunks): use a longer text or a smaller -c")
    n_chunk = len(ids) // n_ctx
    if n_chunks is not None and n_chunks >= 0:
        n_chunk = min(n_chunk, n_chunks)
    if n_chunk < 1:
        raise InvalidArgumentError("no chunk to evaluate (--chunks 0)")
    bad = np.flatnonzero((ids < 0) | (ids >= model.n_vocab))
    if len(bad):
        raise InvalidArgumentError(f"token {int(ids[bad[0]])} at {int(bad[0])} is outside the vocabulary "
                                   f"({model.n_vocab})")
    plan = _plan(n_ctx, n_chunk, n_batch)
    ctx = _context(model, plan, n_threads, type_kv, flash_attn)
    writer = BaseFileWriter(kl_divergence_base, n_ctx, model.n_vocab, n_chunk, ids) \
        if kl_divergence_base is not None else None
    nlls: list[np.ndarray] = []
    chunk_ppl: list[float] = []
    t0 = time.perf_counter()
    bar = _progress_bar(n_chunk, "perplexity", progress)
    try:
        with _ctrl_c_stops(ctx):
            _perplexity_chunks(ctx, plan, ids, bos_id, writer, nlls, chunk_ppl, bar, on_chunk)
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()
    all_nll = np.concatenate(nlls)
    ppl, err = _ppl_and_err(all_nll)
    return PerplexityResult(ppl, err, n_ctx, n_chunk, len(ids), all_nll, chunk_ppl, time.perf_counter() - t0)


def _perplexity_chunks(ctx: Any, plan: _Plan, ids: np.ndarray, bos_id: int | None,
                       writer: BaseFileWriter | None, nlls: list[np.ndarray], chunk_ppl: list[float],
                       bar: Any, on_chunk: Callable[[int, float], None] | None) -> None:
    total = 0.0
    count = 0
    for c, logits, nxt in _chunk_logits(ctx, plan, ids, bos_id):
        nll = nll_of(logits, nxt, float32=writer is not None)
        if writer is not None:
            writer.add_chunk(logits)
        nlls.append(nll)
        total += float(nll.sum())
        count += len(nll)
        chunk_ppl.append(math.exp(total / count))
        bar.update(1)
        bar.set_postfix_str(f"PPL {chunk_ppl[-1]:.4f}", refresh=False)
        if on_chunk is not None:
            on_chunk(c + 1, chunk_ppl[-1])


def kl_divergence(model: Any, base: str | os.PathLike[str] | BaseFile, text: str | None = None, *,
                  tokens: Sequence[int] | np.ndarray | None = None, n_ctx: int | None = None,
                  n_batch: int | None = None, n_chunks: int | None = None, n_threads: int | None = None,
                  type_kv: str = "f16", flash_attn: Any = "auto", bos: int | None | str = "auto",
                  progress: bool | None = False,
                  on_chunk: Callable[[int, dict[str, float]], None] | None = None) -> KLDivergenceResult:
    """KL divergence of a model from the reference log-probs in a base file (llama-perplexity's
    ``--kl-divergence``), over the base file's chunks.

    The chunks' tokens are the base file's; ``text`` or ``tokens``, when given, must tokenize to the
    same tokens (a check that the base was made from this text). ``n_ctx``, when given, must be the
    base file's; ``n_chunks`` evaluates only the first chunks. Other arguments as :func:`perplexity`.

    Raises:
        FileAccessError / FileFormatError: the base file is missing, not a base file, truncated.
        InvalidArgumentError: its vocabulary is not the model's, its n_ctx is not ``n_ctx`` or above
            the model's training context, or its tokens are not the text's.
    """
    import time

    model = _open_model(model)
    own = not isinstance(base, BaseFile)
    bf = BaseFile(base) if own else base  # type: ignore[arg-type]
    try:
        if bf.n_vocab != model.n_vocab:
            raise InvalidArgumentError(f"{bf.path} was computed with a vocabulary of {bf.n_vocab} tokens, "
                                       f"{os.path.basename(model.path)} has {model.n_vocab}")
        if n_ctx is not None and n_ctx != bf.n_ctx:
            raise InvalidArgumentError(f"{bf.path} was computed with a context of {bf.n_ctx} tokens, not "
                                       f"{n_ctx} (-c): drop -c or pass -c {bf.n_ctx}")
        bos_id, tok = _resolve_bos(bos, model)
        if text is not None or tokens is not None:
            ids = _tokens_of(model, text, tokens, tok)
            _check_same_tokens(bf, ids)
        n_chunk = bf.n_chunk if n_chunks is None or n_chunks < 0 else min(bf.n_chunk, n_chunks)
        if n_chunk < 1:
            raise InvalidArgumentError("no chunk to evaluate (--chunks 0)")
        plan = _plan(bf.n_ctx, n_chunk, n_batch)
        ctx = _context(model, plan, n_threads, type_kv, flash_attn)
        stats = KLDivergenceStats()
        chunks: list[dict[str, float]] = []
        t0 = time.perf_counter()
        bar = _progress_bar(n_chunk, "kl-divergence", progress)
        try:
            with _ctrl_c_stops(ctx):
                for c, logits, nxt in _chunk_logits(ctx, plan, bf.tokens, bos_id):
                    stats.add(logits, nxt, bf.rows(c))
                    chunks.append(stats.running())
                    bar.update(1)
                    bar.set_postfix_str(f"KLD {chunks[-1]['kld_mean']:.6f}", refresh=False)
                    if on_chunk is not None:
                        on_chunk(c + 1, chunks[-1])
        finally:
            bar.close()
        return stats.result(bf.n_ctx, n_chunk, chunks, time.perf_counter() - t0)
    finally:
        if own:
            bf.close()


def _check_same_tokens(bf: BaseFile, ids: np.ndarray) -> None:
    want = bf.tokens
    n = min(len(ids), len(want))
    diff = np.flatnonzero(ids[:n] != want[:n])
    if len(diff):
        k = int(diff[0])
        raise InvalidArgumentError(f"the text's tokens are not {bf.path}'s: token {k} is {int(ids[k])} in "
                                   f"the text, {int(want[k])} in the base file (another text or tokenizer?)")
    if len(ids) < len(want):
        raise InvalidArgumentError(f"the text has {len(ids)} tokens, fewer than the {len(want)} of {bf.path} "
                                   f"({bf.n_chunk} chunks of {bf.n_ctx})")
