"""Probabilistic drafting keeps the target's distribution in every mix, and a sequence's sampled
output depends only on its own prompt, parameters and seed.

The statistical tests are built to see errors in q: the draft is a random bigram (its lm head is
zero and its Markov head maps prev -> tempered random logits), so q is far from p and far from
one-hot; one batch mixes temperatures with top-k, top-p and min-p; positions 1.. come from draft
block slots 0..n_draft (position 0 is the prefill token, which never sees the draft); a
reduced-vocabulary draft is tested too. Two-sample chi-square tests against target-only runs,
Bonferroni over groups x positions at a family-wise false-alarm rate of ALPHA = 1e-3 per test.
The same test is shown to reject the output distribution of a broken acceptance rule (q taken at
a neighbour's temperature, the bug this file guards against), computed exactly from the models.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import InvalidArgumentError
from dspark_ggml.llm import LLM
from dspark_ggml.sampling import SamplingParams
from tests.tiny_models import DraftConfig, write_draft, write_id_target
from tests.gguf_edit import rewrite_gguf
from tests.engine_steps import step_to_end

V = 24
E = 64
PROMPT = [3, 17, 5, 9, 1]
ALPHA = 1e-3
GROUPS = [SamplingParams(temperature=1.3), SamplingParams(temperature=0.7, top_k=6),
          SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=0.9, min_p=0.1)]
N_PER_GROUP = 2500
N_POS = 6  # the prefill token, then up to n_draft (4) drafts + the bonus token of the first step


def _after_prompt_logits(target) -> np.ndarray:
    """[V, V]: row x = the target's logits after PROMPT + [x]."""
    ctx = Context(target, n_ctx=64, type_kv="f32", n_threads=1)
    ctx.decode(PROMPT)
    rows = []
    for x in range(V):
        ctx.kv_seq_rm(0, len(PROMPT))
        ctx.decode([x])
        rows.append(ctx.get_logits(copy=True)[0])
    return np.array(rows, dtype=np.float64)


def _bigram(d, tcfg, after: np.ndarray, name: str, draft_vocab: int | None, seed: int) -> tuple:
    """A DSpark draft whose slots ignore the hidden state: q(x | prev) = softmax(W2[x, prev] / T),
    with W2[:, prev] = the target's logits after PROMPT + [prev] plus N(0, 1) noise. q is close to
    p at slot 0 and drifts from it further into the block (the real context differs there)."""
    src = d / f"{name}_src.gguf"
    write_draft(src, DraftConfig(block_size=4, markov_rank=V, own_head=True, draft_vocab=draft_vocab), tcfg, seed=seed)
    d2t = np.arange(V)
    if draft_vocab:
        d2t = np.array(next(t for t in gguf.GGUFReader(src).tensors if t.name == "d2t").data, dtype=np.int64)
    noise = np.random.default_rng(seed).normal(0.0, 1.0, size=(len(d2t), V))
    w2 = (after.T[d2t] + noise).astype(np.float32)  # numpy [Vd, R]: bias[x] = W2[x, prev]
    path = rewrite_gguf(src, d / f"{name}.gguf", tensors={
        "markov_w1.weight": np.eye(V, dtype=np.float32), "markov_w2.weight": w2,
        "output.weight": np.zeros((len(d2t), E), np.float32)})
    return path, w2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("lossless")
    tcfg, target = write_id_target(d, V, n_layer=3)
    after = _after_prompt_logits(target)
    full, w2 = _bigram(d, tcfg, after, "bigram", None, 21)
    reduced, _ = _bigram(d, tcfg, after, "reduced", 16, 22)
    write_draft(d / "dflash.gguf", DraftConfig(kind="dflash", block_size=5), tcfg, seed=11)
    return {"target": target, "target_path": d / "t.gguf", "full": DraftModel(full, target), "full_path": full,
            "w2": w2, "reduced": DraftModel(reduced, target), "dflash": DraftModel(d / "dflash.gguf", target)}


def _engine(target, draft, n_seq: int, mode: str = "probabilistic", backend: bool = False,
            schedule: str = "static") -> Engine:
    ctx = Context(target, n_ctx=n_seq * 32, n_seq_max=n_seq, n_batch=512, type_kv="f32", n_threads=1)
    dctx = DraftContext(draft, n_ctx=n_seq * 32, n_seq_max=n_seq, type_kv="f32", n_threads=1) if draft else None
    return Engine(ctx, dctx, draft_mode=mode, backend_sampling=backend, schedule=schedule if draft else "static")


def _counts(target, draft, seed0: int, n_seq: int = 32, backend: bool = False) -> tuple[np.ndarray, object]:
    """counts[group, position, token] over N_PER_GROUP seeded runs per group; sequence i of a batch
    samples with GROUPS[i % 4], so every batch mixes all four."""
    eng = _engine(target, draft, n_seq, backend=backend)
    counts = np.zeros((len(GROUPS), N_POS, V), dtype=np.int64)
    n_runs = N_PER_GROUP * len(GROUPS)
    for start in range(0, n_runs, n_seq):
        outs = {}
        for s in range(min(n_seq, n_runs - start)):
            g = GROUPS[(start + s) % len(GROUPS)]
            sp = SamplingParams(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, min_p=g.min_p,
                                max_tokens=N_POS, seed=seed0 + start + s)
            outs[s] = list(eng.add(s, PROMPT, sp))
        step_to_end(eng, outs)
        for s, toks in outs.items():
            for j, t in enumerate(toks[:N_POS]):
                counts[(start + s) % len(GROUPS), j, t] += 1
            eng.remove(s)
    return counts, eng.stats()


def _p_same(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the two-sample chi-square test that count vectors a and b share a distribution
    (categories with fewer than 10 counts in both pooled)."""
    from scipy.stats import chi2_contingency

    keep = (a + b) >= 10
    table = np.stack([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table)[1]) if table.shape[1] > 1 else 1.0


def _threshold() -> float:
    return ALPHA / (len(GROUPS) * N_POS)  # Bonferroni


@pytest.fixture(scope="module")
def reference(models):
    return _counts(models["target"], None, seed0=10**6)[0]


@pytest.mark.parametrize("draft,backend", [("full", False), ("reduced", False), ("dflash", False), ("full", True),
                                           ("reduced", True)])
def test_mixed_batch_has_the_target_distribution_at_every_position(models, reference, draft, backend):
    """backend: the verify graph computes p of each draft token and samples the bonus token."""
    spec, st = _counts(models["target"], models[draft], seed0=0, backend=backend)
    assert st.n_accepted > (0.2 if draft != "dflash" else 0.01) * st.n_drafted > 0  # the draft really takes part
    assert st.drafted_at[3] > 0 and st.accepted_at[2 if draft != "dflash" else 0] > 0  # slots beyond 0 too
    worst = min((_p_same(spec[g, j], reference[g, j]), g, j) for g in range(len(GROUPS)) for j in range(N_POS))
    assert worst[0] > _threshold(), f"group {GROUPS[worst[1]]}, position {worst[2]}: p = {worst[0]:.2e}"


# ---- the test is sensitive: a broken acceptance rule is rejected ------------------------------------

def _softmax(x: np.ndarray, t: float) -> np.ndarray:
    z = np.exp((x - x.max()) / t)
    return z / z.sum()


def _step_output(p: np.ndarray, q_draw: np.ndarray, q_test: np.ndarray) -> np.ndarray:
    """Distribution of the first token a speculative step emits when the draft token is drawn from
    q_draw and accepted with probability min(1, p/q_test), the residual being max(p - q_test, 0)."""
    accept = q_draw * np.minimum(1.0, p / q_test)
    resid = np.maximum(p - q_test, 0.0)
    return accept + (1.0 - accept.sum()) * resid / resid.sum()


def _position1_marginals(models, t_test: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact distribution of token 1 for GROUPS[0] (T = 1.3, no filters): the target's own, and
    the engine's if its acceptance test used q at temperature t_test."""
    t = GROUPS[0].temperature
    ctx = Context(models["target"], n_ctx=64, type_kv="f32", n_threads=1)
    ctx.decode(PROMPT)
    p0 = _softmax(ctx.get_logits(copy=True)[0].astype(np.float64), t)
    target, broken = np.zeros(V), np.zeros(V)
    for x0 in range(V):
        ctx.kv_seq_rm(0, len(PROMPT))
        ctx.decode([x0])
        p1 = _softmax(ctx.get_logits(copy=True)[0].astype(np.float64), t)
        logits_q = models["w2"][:, x0].astype(np.float64)  # the bigram's slot-0 logits after x0
        target += p0[x0] * p1
        broken += p0[x0] * _step_output(p1, _softmax(logits_q, t), _softmax(logits_q, t_test))
    return target, broken


def test_the_chi_square_test_rejects_q_at_the_wrong_temperature(models, reference):
    target, broken = _position1_marginals(models, t_test=GROUPS[1].temperature)
    assert np.allclose(_position1_marginals(models, t_test=GROUPS[0].temperature)[1], target)  # the right rule is exact
    rng = np.random.default_rng(7)
    ref = reference[0, 1]
    assert _p_same(rng.multinomial(N_PER_GROUP, target), ref) > _threshold()
    assert _p_same(rng.multinomial(N_PER_GROUP, broken), ref) < _threshold()


def test_engine_position1_matches_the_exact_target_marginal(models):
    from scipy.stats import chisquare

    spec, _ = _counts(models["target"], models["full"], seed0=5 * 10**6, n_seq=32)
    target, _ = _position1_marginals(models, t_test=GROUPS[0].temperature)
    observed = spec[0, 1]
    expected = target * observed.sum()
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(obs, exp)[1] > ALPHA


# ---- reproducibility ------------------------------------------------------------------------------------

def _mixed(i: int) -> SamplingParams:
    g = GROUPS[i % len(GROUPS)]
    return SamplingParams(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, min_p=g.min_p,
                          max_tokens=16 + i % 5, seed=1000 + i)


def _prompt(i: int) -> list[int]:
    return [(5 * i + 7 * j + 2) % V for j in range(2 + i % 4)]


@pytest.mark.parametrize("mode,schedule", [("probabilistic", "static"), ("greedy", "static"),
                                           ("probabilistic", "adaptive"), ("greedy", "adaptive"),
                                           ("probabilistic", "confidence"), ("greedy", "confidence")])
def test_a_sampled_sequence_is_the_same_alone_and_in_a_mixed_batch(models, mode, schedule):
    """Seeded requests: the same tokens alone and among 11 others. The adaptive schedule's block
    length depends on the batch, and the confidence schedule weighs the batch's positions against
    each other; a sampled sequence drafts full blocks, uncut, whatever they are, or its draws would
    depend on the batch too."""
    target, draft = models["target"], models["full"]
    n = 12
    eng = _engine(target, draft, n, mode, schedule=schedule)
    outs = [list(eng.add(s, _prompt(s), _mixed(s))) for s in range(n)]
    step_to_end(eng, outs)
    alone = [_engine(target, draft, 1, mode, schedule=schedule).generate(_prompt(i), _mixed(i)) for i in range(n)]
    assert outs == alone
    # and a different seed changes the output (the seed is used)
    assert _engine(target, draft, 1, mode).generate(_prompt(1), SamplingParams(**{**_mixed(1).__dict__, "seed": 7})) != alone[1]


def test_generate_batch_takes_one_sampling_params_per_prompt(models):
    n = 6
    with LLM(models["target_path"], draft_model_path=models["full_path"], n_seq_max=4, n_ctx=512, n_threads=1,
             type_kv="f32", speculative={"draft_mode": "probabilistic"}) as llm:
        params = [_mixed(i) for i in range(n)]
        params[2] = SamplingParams(max_tokens=9)  # greedy next to sampled ones
        params[4].stop_token_ids = [int(llm.generate(_prompt(4), params[4]).tokens[3])]
        batch = llm.generate_batch([_prompt(i) for i in range(n)], params)
        alone = [llm.generate(_prompt(i), params[i]) for i in range(n)]
        assert [r.tokens for r in batch] == [r.tokens for r in alone]
        assert batch[4].finish_reason == "stop" and len(batch[4].tokens) <= 4
        assert len(batch[2].tokens) == 9
        with pytest.raises(InvalidArgumentError, match="2 entries for 3 prompts"):
            llm.generate_batch([[1], [2], [3]], [SamplingParams(), SamplingParams()])
        with pytest.raises(TypeError, match="SamplingParams"):
            llm.generate_batch([[1], [2]], [SamplingParams(), {"temperature": 1.0}])
        # options apply to each of them
        short = llm.generate_batch([_prompt(0), _prompt(1)], params[:2], max_tokens=3)
        assert [len(r.tokens) for r in short] == [3, 3]


@pytest.mark.parametrize("draft", ["full", "reduced", "dflash"])
def test_the_draft_samples_through_the_sequence_filters(models, draft):
    """top_k = 1 at temperature 1 is argmax for the target and, filtered, for the draft: the
    probabilistic chain then proposes and accepts exactly what the greedy chain does. Unfiltered,
    the draft would sample its whole softmax and be accepted far less often."""
    target, d = models["target"], models[draft]
    greedy = _engine(target, d, 1, "greedy")
    sampled = _engine(target, d, 1, "probabilistic")
    ref = greedy.generate(PROMPT, SamplingParams(max_tokens=40))
    assert sampled.generate(PROMPT, SamplingParams(temperature=1.0, top_k=1, max_tokens=40, seed=3)) == ref
    assert sampled.stats().n_drafted == greedy.stats().n_drafted > 0
    assert sampled.stats().n_accepted == greedy.stats().n_accepted
    if draft != "dflash":  # random weights: rarely right
        assert greedy.stats().n_accepted > 5


@pytest.mark.parametrize("draft", ["full", "reduced"])
def test_in_graph_and_host_rejection_sampling_draw_the_same_tokens(models, draft):
    """The two paths read the sequence's stream in the same order (bonus, one per tested token, one
    for a residual) and define p alike, so the same seeds give the same tokens."""
    outs = []
    for backend in (False, True):
        eng = _engine(models["target"], models[draft], 8, backend=backend)
        got = []
        for s in range(8):
            g = GROUPS[s % len(GROUPS)]
            sp = SamplingParams(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, min_p=g.min_p,
                                max_tokens=12, seed=100 + s)
            got.append(eng.generate(PROMPT, sp, seq_id=s))
        outs.append(got)
    assert outs[0] == outs[1]
