"""The speculative decoding engine: lossless greedy and sampled output, acceptance bookkeeping,
samplers (host vs in-graph), stops, limits and parameters."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import InvalidArgumentError
from dspark_ggml.model import Model
from dspark_ggml.sampling import SamplingParams, sample_rows
from dspark_ggml.speculative import SpeculativeConfig
from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_id_target
from tests.gguf_edit import rewrite_gguf
from tests.engine_steps import step_to_end

V = 24  # a tiny vocabulary: random drafts get accepted now and then, and distributions are testable
PROMPTS = [[3, 17, 5, 9, 1], [8, 8, 2], [20, 4, 11, 6, 13, 2, 7]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    tcfg, target = write_id_target(d, V, n_layer=3)
    drafts = {}
    for name, fields in {"dspark": dict(block_size=4), "dflash": dict(kind="dflash", block_size=5),
                         "dspark-1+N": dict(block_size=5, sample_from_anchor=False, markov_head_type="rnn"),
                         "reduced": dict(draft_vocab=16, own_head=True, markov_head_type="gated")}.items():
        write_draft(d / f"{name}.gguf", DraftConfig(**fields), tcfg, seed=11)
        drafts[name] = DraftModel(d / f"{name}.gguf", target)
    drafts["bigram"] = DraftModel(_bigram_draft(d, target, tcfg), target)
    return target, drafts


def _greedy(target: Model, prompt, n: int) -> list[int]:
    ctx = Context(target, n_ctx=256, type_kv="f32", n_threads=1)
    return Engine(ctx).generate(prompt, SamplingParams(max_tokens=n))


def _bigram_draft(d, target, tcfg):
    """A DSpark draft whose Markov head replays the target's own greedy transitions (prev -> next),
    over a zero lm head: its chains are accepted often, which exercises multi-token acceptance."""
    trans = np.zeros((V, V))
    for p in PROMPTS + [[1], [2], [5, 6]]:
        out = p + _greedy(target, p, 60)
        for a, b in zip(out, out[1:]):
            trans[a, b] += 1
    src = d / "bigram_src.gguf"
    write_draft(src, DraftConfig(block_size=6, markov_rank=V, own_head=True), tcfg, seed=3)
    w2 = np.zeros((V, V), np.float32)  # numpy [Vd, R]: bias[next] = w2[next, prev]
    for prev in range(V):
        if trans[prev].sum():
            w2[int(trans[prev].argmax()), prev] = 30.0
    return rewrite_gguf(src, d / "bigram.gguf", tensors={
        "markov_w1.weight": np.eye(V, dtype=np.float32), "markov_w2.weight": w2,
        "output.weight": np.zeros((V, 64), np.float32)})


def _engine(target, draft=None, n_seq=1, n_ctx=256, **kw):
    ctx = Context(target, n_ctx=n_ctx, n_seq_max=n_seq, n_batch=max(64, n_seq * 8), type_kv="f32", n_threads=1)
    dctx = DraftContext(draft, n_ctx=n_ctx, n_seq_max=n_seq, type_kv="f32", n_threads=1) if draft else None
    return Engine(ctx, dctx, **kw)


@pytest.mark.parametrize("name", ["dspark", "dflash", "dspark-1+N", "reduced", "bigram"])
def test_greedy_is_lossless_for_several_sequences_at_once(setup, name):
    target, drafts = setup
    expected = [_greedy(target, p, 40) for p in PROMPTS]
    eng = _engine(target, drafts[name], n_seq=3)
    outs = {s: list(eng.add(s, p, SamplingParams(max_tokens=40))) for s, p in enumerate(PROMPTS)}
    step_to_end(eng, outs)
    assert [outs[s] for s in range(3)] == expected
    st = eng.stats()
    assert st.n_generated == 120 and st.n_steps > 0


def test_accepted_drafts_are_committed_and_flagged(setup):
    target, drafts = setup
    expected = _greedy(target, PROMPTS[0], 60)
    eng = _engine(target, drafts["bigram"])
    out, flags = list(eng.add(0, PROMPTS[0], SamplingParams(max_tokens=60))), [False]
    while eng.status(0) == "active":
        eng.step()
        toks, fd = eng.new_tokens(0)
        assert 1 <= len(toks) <= eng.n_draft + 1 and not fd[-1]  # the last one is the target's
        out += toks
        flags += fd
    st = eng.stats(0)
    assert out == expected
    assert st.n_accepted == sum(flags) > 20  # the bigram draft is accepted a lot
    assert st.mean_accepted_length > 2.0
    assert st.acceptance_by_position[0] >= st.acceptance_by_position[-1]
    assert len(st.drafted_at) == eng.n_draft and st.drafted_at[0] == st.n_steps


def test_sampled_output_equals_target_only_for_the_same_seed(setup):
    """Greedy-chain drafting samples every emitted token from the target with the sequence's own
    random stream, one draw per emitted token: rejected rows do not shift it."""
    target, drafts = setup
    sp = SamplingParams(temperature=0.9, top_k=10, top_p=0.95, max_tokens=50, seed=1234)
    ref = _engine(target).generate(PROMPTS[2], sp)
    for backend in (False, True):
        eng = _engine(target, drafts["bigram"], backend_sampling=backend)
        assert eng.generate(PROMPTS[2], sp) == ref
        assert eng.stats().n_accepted > 0


def _run_jobs(eng, jobs):
    """Run (prompt, SamplingParams) jobs as sequences 0, 1, ... of one batch; their tokens."""
    outs = {s: list(eng.add(s, prompt, sp)) for s, (prompt, sp) in enumerate(jobs)}
    step_to_end(eng, outs)
    return [outs[s] for s in sorted(outs)]


def test_auto_backend_sampling_matches_the_host_in_mixed_batches(setup):
    """"auto" samples in the graph only batches whose sequences are all greedy; sequences that
    finish change the batch's kind mid-run, and every token stays the host's."""
    target, drafts = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=30)
    short = SamplingParams(temperature=0.8, top_k=20, max_tokens=6, seed=7)  # leaves early: greedy-only after
    jobs = [(PROMPTS[0], greedy), (PROMPTS[1], short), (PROMPTS[2], greedy)]
    host = _run_jobs(_engine(target, drafts["bigram"], n_seq=3, backend_sampling=False), jobs)
    for setting in ("auto", True):
        assert _run_jobs(_engine(target, drafts["bigram"], n_seq=3, backend_sampling=setting), jobs) == host
    assert host[0] == _greedy(target, PROMPTS[0], 30)


def test_backend_sampling_setting_is_checked():
    from dspark_ggml.engine import backend_sampling_value

    assert backend_sampling_value("auto") == -1 and backend_sampling_value(True) == 1
    with pytest.raises(InvalidArgumentError, match="backend_sampling"):
        backend_sampling_value("yes")
    with pytest.raises(InvalidArgumentError, match="backend_sampling"):
        SpeculativeConfig(backend_sampling="sometimes").validate()


def _marginals(target, draft, mode, seeds, n_pos=4, n_seq=32):
    """Token counts at each of the first n_pos generated positions over many seeded runs."""
    eng = _engine(target, draft, n_seq=n_seq, n_ctx=n_seq * 48, draft_mode=mode)
    counts = np.zeros((n_pos, V), dtype=np.int64)
    prompt = PROMPTS[0] + _greedy(target, PROMPTS[0], 30)  # where the bigram draft knows the way
    for start in range(0, len(seeds), n_seq):
        batch = seeds[start:start + n_seq]
        outs = {}
        for s, seed in enumerate(batch):
            outs[s] = list(eng.add(s, prompt, SamplingParams(temperature=0.7, max_tokens=n_pos, seed=int(seed))))
        step_to_end(eng, outs)
        for s in outs:
            for j, t in enumerate(outs[s][:n_pos]):
                counts[j, t] += 1
            eng.remove(s)
    return counts, eng.stats()


def _chi2_same_distribution(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the two-sample chi-square test that count vectors a and b share a distribution."""
    from scipy.stats import chi2_contingency

    keep = (a + b) >= 10  # pool rare categories
    table = np.stack([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table)[1]


N_DRAWS = 20000


@pytest.fixture(scope="module")
def target_only_marginals(setup):
    return _marginals(setup[0], None, "greedy", np.arange(N_DRAWS) + 10**6)[0]


@pytest.mark.parametrize("mode", ["greedy", "probabilistic"])
def test_sampled_output_has_the_target_distribution(setup, target_only_marginals, mode):
    target, drafts = setup
    ref = target_only_marginals
    spec, st = _marginals(target, drafts["bigram"], mode, np.arange(N_DRAWS))
    assert st.n_accepted > 0.2 * st.n_drafted > 0  # the draft really takes part
    for pos in range(spec.shape[0]):
        assert _chi2_same_distribution(spec[pos], ref[pos]) > 1e-3, f"position {pos}"


# ---- samplers: host and in-graph ------------------------------------------------------------------

SAMPLERS = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7),
            SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
            SamplingParams(temperature=0.9, min_p=0.1), SamplingParams(temperature=1.1, top_k=20, top_p=0.9, min_p=0.05)]


@pytest.mark.parametrize("sp", SAMPLERS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}")
def test_host_and_in_graph_samplers_pick_the_same_tokens(sp):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(2000, 50)).astype(np.float32)
    u = rng.random(2000).astype(np.float32)
    u[:20] = 1.0001  # above the final cumulative sum, whatever its rounding
    u[20:40] = 1.0   # a double draw just below 1 that rounds to 1.0f
    host = sample_rows(logits, u, sp)
    graph = sample_rows(logits, u, sp, in_graph=True)
    # ordinary draws agree (float rounding can only matter within ~1e-7 of a boundary); u = 1.0
    # sits on the final cumulative sum itself, so either side of it is a valid outcome
    assert (host[40:] == graph[40:]).mean() >= 0.999
    # the edge: a draw above every cumulative sum falls back to the last candidate, in both
    assert (host[:20] == graph[:20]).all()
    if sp.temperature > 0 and sp.top_k == 0 and sp.top_p == 1.0 and sp.min_p == 0.0:
        assert (host[:20] == logits.shape[1] - 1).all()  # vocabulary order: the last token


def test_host_sampler_follows_the_chain_definition():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, size=(1, 30)).astype(np.float32)
    order = np.argsort(-logits[0], kind="stable")
    p1 = np.exp(logits[0] - logits[0].max()); p1 /= p1.sum()
    # top_k=3 at temperature 1: the draw picks among the three best, in order of cumulative mass
    sp = SamplingParams(temperature=1.0, top_k=3)
    top = order[:3]
    q = np.exp(logits[0, top] - logits[0, top].max()); q /= q.sum()
    for u, want in ((0.0001, top[0]), (q[0] + 1e-4, top[1]), (0.99999, top[2])):
        assert sample_rows(logits, [u], sp)[0] == want
    # min_p=0.5 keeps only tokens within half of the best's probability
    sp = SamplingParams(temperature=1.0, min_p=0.5)
    kept = set(np.flatnonzero(p1 > 0.5 * p1.max()))
    picks = {int(sample_rows(logits, [u], sp)[0]) for u in np.linspace(0.001, 0.999, 50)}
    assert picks <= kept
    assert sample_rows(logits, [0.5], SamplingParams())[0] == order[0]  # temperature 0: argmax


def test_host_sampler_matches_numpy_at_a_large_vocabulary():
    # 40003 tokens: the host softmax's vector blocks of 1024 and its scalar tail of 3 both count;
    # a third of the logits are -inf (a reduced-vocabulary draft's unreachable ids: probability 0)
    # and the three likeliest tokens sit in the tail
    rng = np.random.default_rng(5)
    V, T = 40003, 0.7
    logits = rng.normal(0, 2, size=(V,)).astype(np.float32)
    logits[rng.random(V) < 1 / 3] = -np.inf
    logits[-3:] = [9.0, 8.5, 8.0]
    z = logits.astype(np.float64) / T
    p = np.exp(z - z.max())
    p /= p.sum()
    cdf = np.cumsum(p)
    # draws half-way between cumulative sums, far from any boundary the rounding could move
    picks = np.concatenate([rng.choice(np.flatnonzero(p > 1e-4), 40, replace=False), [V - 3, V - 2, V - 1]])
    u = np.array([cdf[i] - p[i] / 2 for i in picks], np.float32)
    got = sample_rows(np.tile(logits, (len(u), 1)), u, SamplingParams(temperature=T))
    assert list(got) == list(picks)
    assert not np.isin(got, np.flatnonzero(np.isinf(logits))).any()


# ---- stops, limits, parameters ----------------------------------------------------------------------

def test_stops_end_a_sequence_while_others_go_on(setup):
    target, drafts = setup
    full = _greedy(target, PROMPTS[0], 40)
    eng = _engine(target, drafts["bigram"], n_seq=3, eog=[full[10]])
    eng.add(0, PROMPTS[0], SamplingParams(max_tokens=40))
    eng.add(1, PROMPTS[0], SamplingParams(max_tokens=7))
    eng.add(2, PROMPTS[0], SamplingParams(max_tokens=40), stop_sequences=[full[4:6]])
    outs = {s: list(eng.new_tokens(s)[0]) for s in range(3)}
    step_to_end(eng, outs)
    first_eog = full.index(full[10])
    stop = full[4:6]
    first_stop = next(i for i in range(1, len(full)) if full[i - 1:i + 1] == stop)
    assert outs[0] == full[:first_eog + 1] and eng.status(0) == "eog"
    assert outs[1] == full[:7] and eng.status(1) == "length"
    assert outs[2] == full[:first_stop + 1] and eng.status(2) == "stop"


def test_context_full_finishes_the_sequence(setup):
    target, drafts = setup
    eng = _engine(target, drafts["dspark"], n_ctx=32)
    out = eng.generate(PROMPTS[0], SamplingParams(max_tokens=None))
    assert eng.status(0) == "context_full"
    assert out == _greedy(target, PROMPTS[0], len(out))
    assert len(PROMPTS[0]) + len(out) <= 33


def test_n_max_n_min_p_min(setup):
    target, drafts = setup
    eng = _engine(target, drafts["dspark"], n_max=99)
    assert eng.n_draft == 4  # clamped to the anchor-first block size
    assert _engine(target, drafts["dflash"]).n_draft == 4  # block_size - 1
    eng = _engine(target, drafts["bigram"], n_max=2)
    eng.generate(PROMPTS[0], SamplingParams(max_tokens=30))
    st = eng.stats()
    assert len(st.drafted_at) == 2 and st.drafted_at[0] == st.n_steps and st.drafted_at[1] >= st.n_steps - 1
    eng = _engine(target, drafts["bigram"], p_min=1.0)  # no confidence reaches 1: nothing drafted
    eng.generate(PROMPTS[0], SamplingParams(max_tokens=20))
    assert eng.stats().n_drafted == 0
    eng = _engine(target, drafts["bigram"], n_min=6, p_min=0.2)
    out = eng.generate(PROMPTS[0], SamplingParams(max_tokens=30))
    assert out == _greedy(target, PROMPTS[0], 30)
    st = eng.stats()
    assert st.n_drafted % 6 == 0  # every verified block is complete or empty


def _run_batch(eng, n_tokens):
    outs = {s: list(eng.add(s, p, SamplingParams(max_tokens=n_tokens))) for s, p in enumerate(PROMPTS)}
    step_to_end(eng, outs)
    return [outs[s] for s in range(len(PROMPTS))]


def test_confidence_schedule_is_lossless(setup):
    target, drafts = setup
    expected = [_greedy(target, p, 30) for p in PROMPTS]
    assert _run_batch(_engine(target, drafts["bigram"], n_seq=3, schedule="confidence"), 30) == expected


def test_confidence_schedule_changes_the_verify_lengths(setup, tmp_path):
    """A draft that is sure of nothing (confidence ~1e-5 everywhere): the static schedule verifies
    every block in full, the confidence schedule next to nothing, with the same output. A
    scheduler that leaves the blocks alone fails this."""
    target, drafts = setup
    r = drafts["bigram"].info.markov_rank
    unsure = DraftModel(rewrite_gguf(drafts["bigram"].path, tmp_path / "unsure.gguf", tensors={
        "conf_proj.weight": np.zeros((1, 64 + r), np.float32), "conf_proj.bias": np.full(1, -12.0, np.float32)}), target)
    expected = [_greedy(target, p, 30) for p in PROMPTS]
    static = _engine(target, unsure, n_seq=3)
    scheduled = _engine(target, unsure, n_seq=3, schedule="confidence")
    assert _run_batch(static, 30) == expected
    assert _run_batch(scheduled, 30) == expected
    n_static, n_sched = static.stats().n_drafted, scheduled.stats().n_drafted
    assert n_static >= 3 * scheduled.n_draft  # every sequence drafted full blocks
    assert n_sched < n_static / 4, (n_sched, n_static)


@pytest.mark.parametrize("name", ["bigram", "dspark"])
def test_adaptive_schedule_is_lossless(setup, name):
    """Greedy output of three sequences at once equals target-only, whatever block lengths the
    schedule picks (a draft often right, and a random one)."""
    target, drafts = setup
    expected = [_greedy(target, p, 30) for p in PROMPTS]
    assert _run_batch(_engine(target, drafts[name], n_seq=3, schedule="adaptive"), 30) == expected


def test_adaptive_schedule_stops_drafting_what_is_never_accepted(setup, tmp_path):
    """A draft whose every proposal is a token the target never emits: drafting only costs, so the
    adaptive schedule drafts next to nothing (a try now and then) where the static one drafts full
    blocks every step, with the same output. A schedule that ignores acceptance fails this."""
    target, drafts = setup
    expected = [_greedy(target, p, 40) for p in PROMPTS]
    never = 0 if 0 not in {t for e in expected for t in e} else next(t for t in range(V) if t not in
                                                                     {t for e in expected for t in e})
    r = drafts["bigram"].info.markov_rank
    head = np.zeros((V, 64), np.float32)
    bias = np.zeros((V, r), np.float32)
    bias[never, :] = 1e3  # the Markov bias puts `never` on top of every slot
    wrong = DraftModel(rewrite_gguf(drafts["bigram"].path, tmp_path / "wrong.gguf", tensors={
        "output.weight": head, "markov_w1.weight": np.ones((V, r), np.float32), "markov_w2.weight": bias}), target)
    static = _engine(target, wrong, n_seq=3)
    adaptive = _engine(target, wrong, n_seq=3, schedule="adaptive")
    assert _run_batch(static, 40) == expected
    assert _run_batch(adaptive, 40) == expected
    assert static.stats().n_accepted == 0
    n_static, n_adaptive = static.stats().n_drafted, adaptive.stats().n_drafted
    assert n_static >= 3 * static.n_draft * 5  # full blocks, every step
    assert n_adaptive < n_static / 4, (n_adaptive, n_static)


def test_adaptive_schedule_measures_every_position_first(setup):
    """A fresh adaptive schedule's first step drafts the longest block for every sequence: one step
    then measures the acceptance of all positions, which trying one more token at a time from its
    best length can miss (on a model whose verify costs grow unevenly with its length)."""
    target, drafts = setup
    eng = _engine(target, drafts["bigram"], n_seq=3, schedule="adaptive")
    for s, p in enumerate(PROMPTS):
        eng.add(s, p, SamplingParams(max_tokens=40))
    eng.step()
    assert eng.stats().n_drafted == 3 * eng.n_draft


def test_adaptive_and_confidence_schedules_calibrate_on_empty_contexts(setup):
    target, drafts = setup
    ctx = Context(target, n_ctx=256, n_seq_max=2, type_kv="f32", n_threads=1)
    dctx = DraftContext(drafts["bigram"], n_ctx=256, n_seq_max=2, type_kv="f32", n_threads=1)
    Engine(ctx, dctx, schedule="adaptive").add(0, PROMPTS[0])  # calibrates, then leaves cells behind
    with pytest.raises(InvalidArgumentError, match="calibrate on empty contexts"):
        Engine(ctx, dctx, schedule="adaptive")
    assert Engine(ctx, dctx).n_draft > 0  # the static schedule needs no calibration


def test_engine_refuses_what_cannot_work(setup, tmp_path):
    target, drafts = setup
    ctx = Context(target, n_ctx=64, n_outputs_max_per_seq=2)
    dctx = DraftContext(drafts["dspark"], n_ctx=64)
    with pytest.raises(InvalidArgumentError, match="n_outputs_max_per_seq"):
        Engine(ctx, dctx)
    ctx = Context(target, n_ctx=64)
    with pytest.raises(InvalidArgumentError, match="confidence"):
        Engine(ctx, DraftContext(drafts["dflash"], n_ctx=64), schedule="confidence")
    write_draft(tmp_path / "noconf.gguf", DraftConfig(confidence_head=False), TargetConfig(n_vocab=V, n_layer=3,
                                                                                          with_tokenizer=False))
    with pytest.raises(InvalidArgumentError, match="no confidence head: set p_min = 0"):
        Engine(Context(target, n_ctx=64), DraftContext(DraftModel(tmp_path / "noconf.gguf", target), n_ctx=64), p_min=0.5)
    eng = _engine(target, drafts["dspark"])
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        eng.add(0, [1, 99])
    with pytest.raises(InvalidArgumentError, match="sequence id 3"):
        eng.add(3, [1, 2])
    with pytest.raises(InvalidArgumentError, match="top_p"):
        eng.add(0, [1, 2], SamplingParams(top_p=0.0))
    eng.add(0, [1, 2], SamplingParams(max_tokens=5))
    with pytest.raises(InvalidArgumentError, match="still active"):
        eng.add(0, [1, 2])


def test_run_is_the_step_loop_in_one_call(setup):
    """run(n) gives the tokens a loop of step() gives, returns after the step in which a sequence
    finishes (so a waiting request can take its slot), and stops at once while a stop is requested."""
    target, drafts = setup
    jobs = [(PROMPTS[0], SamplingParams(max_tokens=12)), (PROMPTS[1], SamplingParams(max_tokens=40)),
            (PROMPTS[2], SamplingParams(temperature=0.8, seed=3, max_tokens=30))]
    by_steps = _run_jobs(_engine(target, drafts["dspark"], n_seq=3), jobs)

    eng = _engine(target, drafts["dspark"], n_seq=3)
    outs = [list(eng.add(s, prompt, sp)) for s, (prompt, sp) in enumerate(jobs)]
    n_calls = 0
    while any(eng.status(s) == "active" for s in range(3)):
        active_before = [eng.status(s) == "active" for s in range(3)]
        steps = eng.run(1000)
        n_calls += 1
        assert steps >= 1
        for s in range(3):
            outs[s] += eng.new_tokens(s)[0]
        finished = [a and eng.status(s) != "active" for s, a in enumerate(active_before)]
        assert any(finished) or not any(eng.status(s) == "active" for s in range(3))
    assert outs == by_steps
    assert n_calls <= 3 < eng.stats().n_steps  # one call per finishing sequence, many steps each

    with pytest.raises(InvalidArgumentError, match="max_steps"):
        eng.run(0)
    eng.add(0, PROMPTS[0], SamplingParams(max_tokens=20))
    eng.request_abort(True)
    assert eng.run(100) == 0 and eng.status(0) == "active"  # nothing ran, nothing lost
    eng.request_abort(False)
    assert eng.run(100) >= 1
