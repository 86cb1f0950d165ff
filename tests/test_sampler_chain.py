"""The sampler chain (csrc/src/dspark-sampler.h) is one definition run two ways: on the host, a row
at a time, and as one ggml graph over a batch whose rows each have their own sampler. Both are
checked against a numpy reference of the definition (tests/sampler_reference.py) for every on/off
combination of temperature, top-k, top-p and min-p, for batches mixing them, and with a per-row
logit adjustment. Uniforms drawn from the middle of a token's share of the distribution must give
exactly that token everywhere; arbitrary uniforms may differ only within float rounding of a
boundary. tests/test_devices.py runs the graph side on other devices."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dspark_ggml.sampling import SamplingParams, sample_rows
from tests import sampler_reference as ref

V = 60
ROWS = 300


def combos() -> list[SamplingParams]:
    """All 16 on/off combinations of (temperature, top_k, top_p, min_p)."""
    out = []
    for t, k, p, m in itertools.product((False, True), repeat=4):
        out.append(SamplingParams(temperature=0.8 if t else 0.0, top_k=7 if k else 0, top_p=0.85 if p else 1.0,
                                  min_p=0.05 if m else 0.0))
    return out


def _name(sp: SamplingParams) -> str:
    return f"T{sp.temperature}-k{sp.top_k}-p{sp.top_p}-m{sp.min_p}"


def _safe_draws(logits, params, rng, adjust=None):
    """Per row: a uniform inside one candidate's share, and the token the reference draws there."""
    u, want = [], []
    for i, sp in enumerate(params):
        ids, probs = ref.distribution(logits[i], sp, None if adjust is None else adjust[i])
        ui, j = ref.safe_uniform(probs, rng)
        u.append(ui)
        want.append(int(ids[j]))
        assert ref.draw(ids, probs, ui) == ids[j]
    return np.array(u, np.float32), np.array(want)


def _logits(seed: int, rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2.5, size=(rows, V)).astype(np.float32)


@pytest.mark.parametrize("sp", combos(), ids=_name)
def test_host_and_graph_draw_what_the_definition_draws(sp):
    logits = _logits(1)
    rng = np.random.default_rng(2)
    u, want = _safe_draws(logits, [sp] * ROWS, rng)
    host, p_host = sample_rows(logits, u, sp, return_probs=True)
    graph, p_graph = sample_rows(logits, u, sp, in_graph=True, return_probs=True)
    np.testing.assert_array_equal(host, want)
    np.testing.assert_array_equal(graph, want)
    # the probability of the token under the distribution it was drawn from
    p_ref = np.array([ref.distribution(logits[i], sp)[1][list(ref.distribution(logits[i], sp)[0]).index(t)]
                      for i, t in enumerate(want)])
    np.testing.assert_allclose(p_host, p_ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(p_graph, p_ref, rtol=1e-4, atol=1e-6)
    # arbitrary draws: the same but within rounding of a boundary
    ur = rng.random(ROWS).astype(np.float32)
    assert (sample_rows(logits, ur, sp) == sample_rows(logits, ur, sp, in_graph=True)).mean() >= 0.99


def test_one_graph_samples_a_batch_of_mixed_samplers():
    """Each row its own sampler (random values), all in one graph: each row as the host and the
    reference draw it, and as a graph of rows all like it draws it (a row's draw does not depend
    on its neighbours' samplers)."""
    rng = np.random.default_rng(3)
    logits = _logits(4)
    base = combos()
    params = []
    for i in range(ROWS):
        b = base[rng.integers(len(base))]
        params.append(SamplingParams(temperature=float(rng.uniform(0.3, 1.5)) if b.temperature else 0.0,
                                     top_k=int(rng.integers(1, 40)) if b.top_k else 0,
                                     top_p=float(rng.uniform(0.3, 0.99)) if b.top_p < 1 else 1.0,
                                     min_p=float(rng.uniform(0.01, 0.3)) if b.min_p else 0.0))
    u, want = _safe_draws(logits, params, rng)
    np.testing.assert_array_equal(sample_rows(logits, u, params), want)
    np.testing.assert_array_equal(sample_rows(logits, u, params, in_graph=True), want)
    for i in range(0, ROWS, 37):
        alone = sample_rows(logits[i:i + 1], u[i:i + 1], params[i], in_graph=True)
        assert alone[0] == want[i]


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=0.9),
                                SamplingParams(temperature=1.2, top_k=10, top_p=0.9),
                                SamplingParams(temperature=0.7, min_p=0.2)], ids=_name)
def test_a_per_row_adjustment_comes_first(sp):
    """A bias and bans (-inf) per row, added before the chain: never a banned token, and the
    host, the graph and the reference agree."""
    rng = np.random.default_rng(5)
    logits = _logits(6)
    adjust = rng.normal(0, 1.0, size=logits.shape).astype(np.float32)
    banned = rng.random(logits.shape) < 0.3
    banned[np.arange(ROWS), np.argmax(logits + adjust, axis=1)] = True  # the best token is banned
    adjust[banned] = -np.inf
    u, want = _safe_draws(logits, [sp] * ROWS, rng, adjust)
    host = sample_rows(logits, u, sp, adjust=adjust)
    graph = sample_rows(logits, u, sp, adjust=adjust, in_graph=True)
    np.testing.assert_array_equal(host, want)
    np.testing.assert_array_equal(graph, want)
    assert not banned[np.arange(ROWS), host].any()


@pytest.mark.parametrize("sp", [s for s in combos() if s.temperature > 0 and (s.top_k or s.top_p < 1 or s.min_p)], ids=_name)
def test_a_draw_at_the_top_end_stays_within_the_kept_candidates(sp):
    """u = 1 (a double just below 1 rounds to 1.0f) and u > 1 land on a candidate the filters
    keep, whatever the graph's window."""
    logits = _logits(7, 50)
    for u in (1.0, 1.0001):
        uu = np.full(50, u, np.float32)
        host = sample_rows(logits, uu, sp)
        np.testing.assert_array_equal(sample_rows(logits, uu, sp, in_graph=True), host)
        for i in range(50):
            ids, probs = ref.distribution(logits[i], sp)
            assert host[i] in set(ids[probs > 0].tolist())
