"""The sampler chain of csrc/src/dspark-sampler.h in numpy (float64), written from its definition:
the oracle the host and in-graph samplers are both checked against, and the uniforms that land
safely inside one token's share of the cumulative distribution (far from any rounding)."""
from __future__ import annotations

import numpy as np

from dspark_ggml.sampling import SamplingParams


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def distribution(logits: np.ndarray, sp: SamplingParams, adjust: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(candidate ids in draw order, their probabilities) of one row."""
    x = logits.astype(np.float64)
    if adjust is not None:
        x = x + adjust
    V = len(x)
    if sp.temperature <= 0:
        return np.array([int(np.argmax(x))]), np.array([1.0])
    if not ((0 < sp.top_k < V) or sp.top_p < 1 or sp.min_p > 0):
        return np.arange(V), _softmax(x / sp.temperature)  # vocabulary order
    order = np.argsort(-x, kind="stable")
    n = sp.top_k if 0 < sp.top_k < V else V
    ids, s = order[:n], x[order[:n]]
    last = n - 1  # top-k: the k-th best
    if sp.top_p < 1 or sp.min_p > 0:
        p1 = _softmax(np.where(s >= s[last], s, -np.inf))  # temperature 1, over what top-k keeps
        before = np.cumsum(p1) - p1
        if sp.top_p < 1:
            last = min(last, int((before < sp.top_p).sum()) - 1)
        if sp.min_p > 0:
            last = min(last, int((p1 > sp.min_p * p1[0]).sum()) - 1)
    kept = s >= s[max(last, 0)]  # ties with the last kept candidate stay
    return ids, _softmax(np.where(kept, s, -np.inf) / sp.temperature)


def draw(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The first candidate whose cumulative probability reaches u times the total."""
    c = np.cumsum(probs)
    return int(ids[min(int(np.searchsorted(c, u * c[-1], side="left")), len(ids) - 1)])


def safe_uniform(probs: np.ndarray, rng: np.random.Generator, min_share: float = 1e-3) -> tuple[float, int]:
    """A uniform in the middle of a random candidate's share of the cumulative distribution (one
    with at least min_share of it), and that candidate's position."""
    c = np.cumsum(probs) / probs.sum()
    i = int(rng.choice(np.flatnonzero(probs / probs.sum() >= min_share)))
    return float((c[i] - probs[i] / probs.sum() / 2)), i
