"""Per-request sampler fields under speculation: logit bias, penalties (llama.cpp's repeat penalty,
OpenAI's presence / frequency), logprobs and prompt logprobs. Checked against a numpy reference
built on target-only decoding through the Context API, and with the draft on vs off."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dspark_ggml import _lib
from dspark_ggml.context import Context
from dspark_ggml.draft import DraftModel
from dspark_ggml.errors import InvalidArgumentError
from dspark_ggml.sampling import SamplingParams
from tests.test_engine import PROMPTS, V, _bigram_draft, _chi2_same_distribution, _engine
from tests.tiny_models import DraftConfig, write_draft, write_id_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("adjust")
    tcfg, target = write_id_target(d, V, n_layer=3)
    write_draft(d / "dspark.gguf", DraftConfig(block_size=4), tcfg, seed=11)
    return target, {"bigram": DraftModel(_bigram_draft(d, target, tcfg), target),
                    "dspark": DraftModel(d / "dspark.gguf", target)}


# ---- the reference ----------------------------------------------------------------------------------

def ref_adjusted(logits: np.ndarray, history: list[int], sp: SamplingParams) -> np.ndarray:
    """llama.cpp's order: logits + bias, then the penalties over the last penalty_last_n tokens."""
    x = logits.astype(np.float64).copy()
    for t, b in (sp.logit_bias or {}).items():
        x[t] += b
    n = sp.penalty_last_n
    window = history if n == -1 else (history[-n:] if n > 0 else [])
    for t, c in Counter(window).items():
        if sp.repeat_penalty not in (0.0, 1.0):
            x[t] = x[t] * sp.repeat_penalty if x[t] <= 0 else x[t] / sp.repeat_penalty
        x[t] -= c * sp.frequency_penalty + sp.presence_penalty
    return x


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x[np.isfinite(x)])
    with np.errstate(divide="ignore"):
        return x - m - np.log(np.sum(np.exp(x - m)))


def ref_greedy(target, prompt: list[int], sp: SamplingParams) -> tuple[list[int], list[np.ndarray]]:
    """Target-only greedy decoding with the adjustment, one token at a time: tokens and each
    step's log_softmax of the adjusted logits."""
    ctx = Context(target, n_ctx=256, type_kv="f32", n_threads=1)
    ctx.decode(prompt)
    history, out, lps = list(prompt), [], []
    for _ in range(sp.max_tokens):
        x = ref_adjusted(ctx.get_logits(copy=True)[-1], history, sp)
        t = int(np.argmax(x))
        out.append(t)
        lps.append(log_softmax(x))
        history.append(t)
        ctx.decode([t])
    ctx.close()
    return out, lps


def run_engine(eng, jobs):
    """(prompt, SamplingParams) jobs as sequences 0, 1, ... of one batch: tokens and logprobs each."""
    toks = {s: list(eng.add(s, p, sp)) for s, (p, sp) in enumerate(jobs)}
    lps = {s: eng.new_logprobs(s) for s in toks}
    while any(eng.status(s) == "active" for s in toks):
        eng.step()
        for s in toks:
            toks[s] += eng.new_tokens(s)[0]
            lps[s] += eng.new_logprobs(s)
    return [toks[s] for s in sorted(toks)], [lps[s] for s in sorted(toks)]


FIELDS = {
    "bias": dict(logit_bias={5: 4.0, 16: -np.inf, 8: -2.5}),
    "presence+frequency": dict(presence_penalty=1.5, frequency_penalty=0.7),
    "repeat": dict(repeat_penalty=1.8, penalty_last_n=12),
    "repeat-context": dict(repeat_penalty=1.3, penalty_last_n=-1),
    "all": dict(logit_bias={1: -1.0, 3: 2.0}, presence_penalty=-0.5, frequency_penalty=1.0,
                repeat_penalty=1.5, penalty_last_n=6),
}


# ---- greedy ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIELDS))
def test_greedy_with_fields_matches_the_numpy_reference_with_and_without_the_draft(pair, name):
    target, drafts = pair
    sp = SamplingParams(max_tokens=40, logprobs=3, **FIELDS[name])
    ref, ref_lps = ref_greedy(target, PROMPTS[2], sp)
    plain, _ = ref_greedy(target, PROMPTS[2], SamplingParams(max_tokens=40))
    assert ref != plain  # the fields change the output
    runs = {}
    for dname in (None, "bigram", "dspark"):
        eng = _engine(target, drafts[dname] if dname else None)
        (toks,), (lps,) = run_engine(eng, [(PROMPTS[2], sp)])
        runs[dname] = lps
        assert toks == ref, dname
        for t, e, r in zip(toks, lps, ref_lps):
            assert e.token == t
            assert e.logprob == pytest.approx(r[t], abs=1e-4)
            top = sorted(range(V), key=lambda v: (-r[v], v))[:3]
            assert [i for i, _ in e.top] == top
            assert [lp for _, lp in e.top] == pytest.approx([r[v] for v in top], abs=1e-4)
        if dname == "bigram":
            assert eng.stats().n_accepted > 0  # the draft took part
    for dname in ("bigram", "dspark"):  # bit for bit, not just close
        assert [(e.token, e.logprob, e.top) for e in runs[dname]] == [(e.token, e.logprob, e.top) for e in runs[None]]


@pytest.mark.parametrize("backend", [False, True, "auto"])
@pytest.mark.parametrize("name", ["bias", "presence+frequency"])
def test_additive_fields_sample_in_the_graph_or_on_the_host_alike(pair, name, backend):
    """Without logprobs or a repeat penalty the adjustment is additive: an in-graph sampler takes
    it as an input (backend True, or "auto" with greedy rows), with the same tokens."""
    target, drafts = pair
    sp = SamplingParams(max_tokens=40, **FIELDS[name])
    ref, _ = ref_greedy(target, PROMPTS[2], sp)
    eng = _engine(target, drafts["bigram"], backend_sampling=backend)
    assert run_engine(eng, [(PROMPTS[2], sp)])[0][0] == ref
    sampled = SamplingParams(max_tokens=30, temperature=0.9, top_k=10, seed=4, **FIELDS[name])
    host = run_engine(_engine(target), [(PROMPTS[1], sampled)])[0]
    assert run_engine(_engine(target, drafts["bigram"], backend_sampling=backend), [(PROMPTS[1], sampled)])[0] == host


@pytest.mark.parametrize("backend", [False, True, "auto"])
def test_batches_mixing_plain_and_adjusted_sequences(pair, backend):
    """A sequence with fields samples on the host; its batch mates keep their own output."""
    target, drafts = pair
    plain = SamplingParams(max_tokens=25)
    fields = SamplingParams(max_tokens=25, **FIELDS["all"])
    sampled = SamplingParams(max_tokens=25, temperature=0.8, top_k=8, seed=5)
    additive = SamplingParams(max_tokens=25, **FIELDS["bias"])
    jobs = [(PROMPTS[0], plain), (PROMPTS[1], fields), (PROMPTS[2], sampled), (PROMPTS[0], fields),
            (PROMPTS[2], additive)]
    alone = [run_engine(_engine(target), [job])[0][0] for job in jobs]
    eng = _engine(target, drafts["bigram"], n_seq=5, backend_sampling=backend)
    assert run_engine(eng, jobs)[0] == alone
    eng = _engine(target, drafts["bigram"], n_seq=3, backend_sampling=backend)  # plain and additive only
    assert run_engine(eng, [jobs[0], jobs[2], jobs[4]])[0] == [alone[0], alone[2], alone[4]]
    assert alone[1] == ref_greedy(target, PROMPTS[1], fields)[0]


# ---- sampled ------------------------------------------------------------------------------------------

def ref_sampled_logprob(logits, history, sp, token, top_k):
    """logprob of `token` under top_k then temperature of the adjusted logits (ties with the k-th stay)."""
    x = ref_adjusted(logits, history, sp)
    kth = np.sort(x)[::-1][top_k - 1]
    y = np.where(x >= kth, x / sp.temperature, -np.inf)
    return log_softmax(y)[token]


def test_seeded_sampling_with_fields_is_the_same_with_and_without_the_draft(pair):
    """Greedy-chain drafting draws every token from the adjusted target rows with the sequence's
    stream: tokens and logprobs equal target-only's; the logprobs are the sampler's distribution."""
    target, drafts = pair
    sp = SamplingParams(temperature=0.9, top_k=6, seed=77, max_tokens=40, logprobs=2, **FIELDS["all"])
    ref_t, ref_l = run_engine(_engine(target), [(PROMPTS[2], sp)])
    for backend in (False, True):
        eng = _engine(target, drafts["bigram"], backend_sampling=backend)
        t, lp = run_engine(eng, [(PROMPTS[2], sp)])
        assert t == ref_t
        assert [(e.logprob, e.top) for e in lp[0]] == [(e.logprob, e.top) for e in ref_l[0]]
    # against numpy, along the engine's own tokens
    ctx = Context(target, n_ctx=256, type_kv="f32", n_threads=1)
    ctx.decode(PROMPTS[2])
    history = list(PROMPTS[2])
    for t, e in zip(ref_t[0], ref_l[0]):
        assert e.logprob == pytest.approx(ref_sampled_logprob(ctx.get_logits(copy=True)[-1], history, sp, t, 6), abs=1e-4)
        assert e.logprob > -np.inf and len(e.top) == 2
        history.append(t)
        ctx.decode([t])


def _marginals(target, draft, sp_of_seed, seeds, n_pos=3, n_seq=32, mode="greedy"):
    eng = _engine(target, draft, n_seq=n_seq, n_ctx=n_seq * 48, draft_mode=mode)
    counts = np.zeros((n_pos, V), dtype=np.int64)
    prompt = PROMPTS[0] + [21, 17, 1, 16, 8, 1, 16, 8]
    for start in range(0, len(seeds), n_seq):
        batch = seeds[start:start + n_seq]
        outs = run_engine(eng, [(prompt, sp_of_seed(int(s))) for s in batch])[0]
        for s, out in enumerate(outs):
            for j, t in enumerate(out[:n_pos]):
                counts[j, t] += 1
            eng.remove(s)
    return counts, eng.stats()


def test_probabilistic_drafting_keeps_the_adjusted_distribution(pair):
    """Rejection sampling against the adjusted rows: the draft's q ignores the fields, the output
    still has the target's adjusted distribution (chi-square against target-only)."""
    target, drafts = pair
    fields = dict(logit_bias={16: 2.0, 1: -1.0}, presence_penalty=1.0, frequency_penalty=0.5)

    def sp(seed):
        return SamplingParams(temperature=1.0, max_tokens=3, seed=seed, **fields)

    n = 3000
    ref, _ = _marginals(target, None, sp, np.arange(n) + 10**6)
    spec, st = _marginals(target, drafts["bigram"], sp, np.arange(n), mode="probabilistic")
    assert st.n_accepted > 0
    for pos in range(ref.shape[0]):
        assert _chi2_same_distribution(spec[pos], ref[pos]) > 1e-3, f"position {pos}"


# ---- prompt logprobs --------------------------------------------------------------------------------------

def test_prompt_logprobs_are_the_plain_log_softmax_of_the_rows_before(pair):
    target, drafts = pair
    prompt = PROMPTS[2] + PROMPTS[0]
    ctx = Context(target, n_ctx=256, type_kv="f32", n_threads=1)
    ctx.decode(prompt, outputs=[True] * len(prompt))
    ref = [log_softmax(row.astype(np.float64)) for row in ctx.get_logits(copy=True)]
    eng = _engine(target, drafts["bigram"])
    sp = SamplingParams(max_tokens=3, prompt_logprobs=2)
    eng.add(0, prompt, sp)
    got = eng.prompt_logprobs(0, prompt)
    assert got[0] is None and len(got) == len(prompt)
    for i, e in enumerate(got[1:]):
        assert e.token == prompt[i + 1]
        assert e.logprob == pytest.approx(ref[i][prompt[i + 1]], abs=1e-4)
        assert [t for t, _ in e.top] == sorted(range(V), key=lambda v: (-ref[i][v], v))[:2]
    assert eng.new_logprobs(0) == []  # logprobs not asked for


def test_prompt_logprobs_of_a_prompt_longer_than_the_outputs_of_one_batch(pair):
    """The prefill outputs every row in chunks of at most n_outputs_max rows."""
    from dspark_ggml.engine import Engine

    target, _ = pair
    prompt = (PROMPTS[2] + PROMPTS[0] + PROMPTS[1]) * 2
    sp = SamplingParams(max_tokens=4, prompt_logprobs=1)
    ref = _engine(target)
    ref.add(0, prompt, sp)
    small = Engine(Context(target, n_ctx=256, n_batch=64, n_outputs_max_per_seq=4, type_kv="f32", n_threads=1))
    assert small.add(0, prompt, sp) == ref.new_tokens(0)[0]
    got, want = small.prompt_logprobs(0, prompt), ref.prompt_logprobs(0, prompt)
    assert [(e.logprob, e.top) for e in got[1:]] == [(e.logprob, e.top) for e in want[1:]]


def test_prompt_logprobs_skip_the_prompt_cache(pair):
    target, _ = pair
    eng = _engine(target)
    prompt = PROMPTS[2] * 3
    eng.generate(prompt, SamplingParams(max_tokens=2))
    eng.detach(0)
    sp = SamplingParams(max_tokens=2, prompt_logprobs=0)
    eng.add(0, prompt, sp, reuse_prefix=True)
    assert eng.stats(0).n_cached == 0
    assert len(eng.prompt_logprobs(0, prompt)) == len(prompt)


def test_llm_generate_and_stream_carry_logprobs(pair):
    """Through LLM.generate (the DecodeLoop): the engine's entries, and the prompt's on the result."""
    from dspark_ggml.decode_loop import DecodeLoop, Request
    from dspark_ggml.interrupt import Interrupt

    target, drafts = pair
    sp = SamplingParams(max_tokens=12, logprobs=1, prompt_logprobs=1, **FIELDS["bias"])
    eng = _engine(target, drafts["bigram"])
    chunks = list(DecodeLoop(eng, 1, None, Interrupt(), per_step=True).run([Request(PROMPTS[1], sp, [], [])]))
    toks = [t for c in chunks for t in c.tokens]
    lps = [e for c in chunks for e in (c.logprobs or [])]
    assert [e.token for e in lps] == toks
    assert chunks[0].prompt_logprobs is not None and len(chunks[0].prompt_logprobs) == len(PROMPTS[1])
    ref, ref_lps = ref_greedy(target, PROMPTS[1], sp)
    assert toks == ref
    assert [e.logprob for e in lps] == pytest.approx([r[t] for t, r in zip(ref, ref_lps)], abs=1e-4)


# ---- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, name", [
    (dict(logprobs=21), "logprobs"), (dict(logprobs=-1), "logprobs"), (dict(prompt_logprobs=25), "prompt_logprobs"),
    (dict(penalty_last_n=-2), "penalty_last_n"), (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"), (dict(repeat_penalty=-1.0), "repeat_penalty"),
    (dict(logit_bias={3: float("nan")}), "logit_bias"), (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={3: float("inf")}), "logit_bias"),
])
def test_bad_fields_are_refused_by_name(pair, fields, name):
    with pytest.raises(InvalidArgumentError, match=name):
        SamplingParams(**fields).validate()
    eng = _engine(pair[0])
    with pytest.raises(InvalidArgumentError, match=name):
        eng.add(0, PROMPTS[0], SamplingParams(**fields))
    assert eng.status(0) == "idle" and eng.target.kv_n_used == 0


def _raw_add(eng, **fields):
    """dspark_engine_add with request fields set directly (past the Python checks)."""
    lib, ffi = _lib.lib(), _lib.ffi()
    prompt = ffi.new("int32_t[]", PROMPTS[0])
    r = ffi.new("struct dspark_request *")
    r.prompt, r.n_prompt, r.max_tokens = prompt, len(PROMPTS[0]), 4
    keep = []
    for k, v in fields.items():
        if k == "logit_bias":
            arr = ffi.new("struct dspark_logit_bias[]", len(v))
            for i, (t, b) in enumerate(v):
                arr[i].token, arr[i].bias = t, b
            keep.append(arr)
            r.logit_bias, r.n_logit_bias = arr, len(v)
        else:
            setattr(r, k, v)
    return lib.dspark_engine_add(eng.handle, 0, r)


@pytest.mark.parametrize("fields, name", [
    (dict(logit_bias=[(V, 1.0)]), "logit_bias"), (dict(logit_bias=[(2, float("nan"))]), "logit_bias"),
    (dict(top_logprobs=21, logprobs=True), "top_logprobs"), (dict(top_logprobs=-1), "top_logprobs"),
    (dict(penalty_last_n=-5), "penalty_last_n"), (dict(presence_penalty=-3.0), "presence_penalty"),
    (dict(repeat_penalty=float("inf")), "repeat_penalty"), (dict(n_logit_bias=2), "logit_bias"),
])
def test_the_core_refuses_bad_fields_and_changes_nothing(pair, fields, name):
    eng = _engine(pair[0])
    eng.generate(PROMPTS[1], SamplingParams(max_tokens=3), seq_id=0)
    used = eng.target.kv_n_used
    assert _raw_add(eng, **fields) == _lib.lib().DSPARK_STATUS_INVALID_ARGUMENT
    assert name in _lib.last_error()
    assert eng.target.kv_n_used == used  # the old sequence's cells are still there


def test_logit_bias_outside_the_vocabulary_is_refused_by_the_engine(pair):
    eng = _engine(pair[0])
    with pytest.raises(InvalidArgumentError, match=f"logit_bias: token {V} is outside"):
        eng.add(0, PROMPTS[0], SamplingParams(logit_bias={V: 1.0}))
    assert eng.status(0) == "idle"
