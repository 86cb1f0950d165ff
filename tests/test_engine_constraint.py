"""Token constraints (the grammar hook of structured output) under speculation: masks on the
target's verify rows, drafts cut where the grammar rejects a drafted token, commits in order,
lossless output, and a failing callback as a clean error of its call."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.draft import DraftModel
from dspark_ggml.errors import ConstraintError
from dspark_ggml.sampling import SamplingParams
from tests.test_engine import PROMPTS, V, _bigram_draft, _chi2_same_distribution, _engine
from tests.gguf_edit import rewrite_gguf
from tests.tiny_models import DraftConfig, write_draft, write_id_target
from tests.engine_steps import step_to_end

EOS = 0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("constraint")
    tcfg, target = write_id_target(d, V, n_layer=3)
    return target, DraftModel(_bigram_draft(d, target, tcfg), target), DraftModel(_soft_draft(d, tcfg), target)


SOFT = (1, 8, 0, 20)  # the soft draft's favourites: two the test bans, two the target likes


def _soft_draft(d, tcfg):
    """A DSpark draft whose every slot samples from one spread distribution (a Markov bias of 4 on
    SOFT over a zero lm head): at temperature 2, q(SOFT) ~ 15% each, ~2% for the others."""
    src = d / "soft_src.gguf"
    write_draft(src, DraftConfig(block_size=6, markov_rank=V, own_head=True), tcfg, seed=3)
    w2 = np.zeros((V, V), np.float32)
    w2[list(SOFT), :] = 4.0
    return rewrite_gguf(src, d / "soft.gguf", tensors={
        "markov_w1.weight": np.eye(V, dtype=np.float32), "markov_w2.weight": w2,
        "output.weight": np.zeros((V, 64), np.float32)})


def _row(allowed) -> np.ndarray:
    row = np.zeros((V + 31) // 32, np.uint32)
    for t in allowed:
        row[t // 32] |= np.uint32(1 << (t % 32))
    return row


class OnlySet:
    """Allows tokens of a set; after `limit` tokens, only EOS. Records every call."""

    def __init__(self, allowed, limit: int | None = None) -> None:
        self.allowed, self.limit = set(allowed), limit
        self.committed: list[int] = []
        self.calls: list[tuple[int, int]] = []  # (tokens asked, rows filled)
        self.fail_masks_at = self.fail_commit_at = None

    def _allowed_after(self, n: int) -> set[int]:
        return {EOS} if self.limit is not None and n >= self.limit else self.allowed

    def fill_masks(self, tokens, out) -> int:
        if self.fail_masks_at is not None and len(self.calls) == self.fail_masks_at:
            self.fail_masks_at = None
            raise RuntimeError("grammar exploded")
        n = len(self.committed)
        rows = 1
        out[0] = _row(self._allowed_after(n))
        for i, t in enumerate(tokens):
            if t not in self._allowed_after(n + i):
                break
            out[i + 1] = _row(self._allowed_after(n + i + 1))
            rows += 1
        self.calls.append((len(tokens), rows))
        return rows

    def commit(self, tokens) -> None:
        if self.fail_commit_at is not None and len(self.committed) >= self.fail_commit_at:
            self.fail_commit_at = None
            raise ValueError("commit refused")
        for t in tokens:
            assert t in self._allowed_after(len(self.committed)), (t, self.committed)
            self.committed.append(t)


def _generate(eng, prompt, sp, constraint, seq_id=0):
    out = list(eng.add(seq_id, prompt, sp, constraint=constraint))
    while eng.status(seq_id) == "active":
        eng.step()
        out += eng.new_tokens(seq_id)[0]
    return out


# the bigram draft proposes the target's unconstrained continuation: a set that bans part of it
# makes the grammar cut drafts, while what it allows is still accepted
SETS = {"low": range(0, 12), "odd": [1, 3, 5, 7, 9, 11, 13, 15, 17], "most": [t for t in range(V) if t not in (16, 21)]}


@pytest.mark.parametrize("name", sorted(SETS))
def test_greedy_constrained_output_is_lossless_and_allowed(pair, name):
    target, draft = pair[:2]
    sp = SamplingParams(max_tokens=40)
    ref_c = OnlySet(SETS[name])
    ref = _generate(_engine(target), PROMPTS[0], sp, ref_c)
    assert all(t in ref_c.allowed for t in ref)
    assert ref_c.committed == ref
    assert ref_c.calls[0] == (0, 1)  # the prefill asks the empty continuation's mask
    c = OnlySet(SETS[name])
    eng = _engine(target, draft)
    out = _generate(eng, PROMPTS[0], sp, c)
    assert out == ref
    assert c.committed == out
    st = eng.stats(0)
    # every drafted token the engine verified was one the grammar allowed: the drafts were cut
    assert st.n_drafted == sum(rows - 1 for _, rows in c.calls)
    assert any(rows - 1 < asked for asked, rows in c.calls)  # some were cut
    assert st.n_accepted > 0


def test_digits_then_eos(pair):
    """A grammar that ends the output: the engine's end-of-generation token is forced."""
    target, draft = pair[:2]
    for d in (None, draft):
        eng = _engine(target, d)
        eng.set_eog([EOS])
        c = OnlySet(range(1, 11), limit=5)
        out = _generate(eng, PROMPTS[1], SamplingParams(max_tokens=30), c)
        assert len(out) == 6 and out[-1] == EOS and all(1 <= t <= 10 for t in out[:5])
        assert eng.status(0) == "eog"


def test_seeded_sampling_with_a_constraint_is_the_same_with_the_draft(pair):
    target, draft = pair[:2]
    sp = SamplingParams(temperature=1.0, seed=9, max_tokens=40, logprobs=1)
    ref_c = OnlySet(SETS["most"])
    eng = _engine(target)
    ref = _generate(eng, PROMPTS[2], sp, ref_c)
    for backend in (False, True):
        c = OnlySet(SETS["most"])
        assert _generate(_engine(target, draft, backend_sampling=backend), PROMPTS[2], sp, c) == ref


def _marginals(target, draft, seeds, allowed, mode, n_pos=3, n_seq=32, backend="auto"):
    eng = _engine(target, draft, n_seq=n_seq, n_ctx=n_seq * 48, draft_mode=mode, backend_sampling=backend)
    counts = np.zeros((n_pos, V), dtype=np.int64)
    prompt = PROMPTS[0] + [21, 17, 1, 16, 8, 1, 16, 8]
    cut = 0
    for start in range(0, len(seeds), n_seq):
        batch = seeds[start:start + n_seq]
        cs = {s: OnlySet(allowed) for s in range(len(batch))}
        outs = {s: list(eng.add(s, prompt, SamplingParams(temperature=2.0, max_tokens=n_pos, seed=int(seed)),
                                constraint=cs[s])) for s, seed in enumerate(batch)}
        step_to_end(eng, outs)
        for s, out in outs.items():
            for j, t in enumerate(out[:n_pos]):
                counts[j, t] += 1
            cut += sum(rows - 1 < asked for asked, rows in cs[s].calls)
            eng.remove(s)
    return counts, eng.stats(), cut


@pytest.mark.parametrize("backend", ["auto", True])
def test_probabilistic_drafting_under_a_constraint_keeps_the_distribution(pair, backend):
    """A sampled draft token the grammar bans is a certain rejection: the cut block emits a draw of
    the residual at that slot, so the output keeps the constrained target distribution (at
    temperature 2 p is spread, and the residual differs from p where q is large). backend True:
    the masks go into the verify graph's sampler, p of the cut slot comes from its kept row."""
    target, draft = pair[0], pair[2]
    allowed = [t for t in range(V) if t not in (1, 8)]  # two of the draft's favourites, banned
    n = 20000  # at this size, sampling p instead of the residual at a cut slot gives p < 1e-20
    ref, _, _ = _marginals(target, None, np.arange(n) + 10**6, allowed, "greedy")
    spec, st, cut = _marginals(target, draft, np.arange(n), allowed, "probabilistic", backend=backend)
    assert cut > 100 and st.n_accepted > 0
    for pos in range(ref.shape[0]):
        assert ref[pos][[1, 8]].sum() == 0 and spec[pos][[1, 8]].sum() == 0
        assert _chi2_same_distribution(spec[pos], ref[pos]) > 1e-3, f"position {pos}"


# ---- failures -----------------------------------------------------------------------------------------------

def test_a_failing_mask_callback_at_add_is_a_clean_error(pair):
    target, draft = pair[:2]
    eng = _engine(target, draft)
    c = OnlySet(SETS["low"])
    c.fail_masks_at = 0
    cause = None
    try:  # (not pytest.raises(...) as info: a frame <-> exception cycle holding the engine)
        eng.add(0, PROMPTS[0], SamplingParams(max_tokens=10), constraint=c)
    except ConstraintError as e:
        assert "grammar exploded" in str(e)
        cause = e.__cause__
    assert isinstance(cause, RuntimeError)
    assert eng.status(0) == "idle" and eng.target.kv_n_used == 0
    assert _generate(eng, PROMPTS[0], SamplingParams(max_tokens=10), OnlySet(SETS["low"])) == \
        _generate(_engine(target), PROMPTS[0], SamplingParams(max_tokens=10), OnlySet(SETS["low"]))


def test_a_failing_mask_callback_in_a_step_fails_that_step_only(pair):
    """The masks are asked before the verify: the failed step commits nothing, and the next
    steps go on as if it had not run."""
    target, draft = pair[:2]
    sp = SamplingParams(max_tokens=30)
    ref = _generate(_engine(target), PROMPTS[0], sp, OnlySet(SETS["most"]))
    eng = _engine(target, draft)
    c = OnlySet(SETS["most"])
    c.fail_masks_at = 3
    out = list(eng.add(0, PROMPTS[0], sp, constraint=c))
    failures = 0
    while eng.status(0) == "active":
        try:
            eng.step()
        except ConstraintError:
            failures += 1
            assert eng.new_tokens(0)[0] == []
            continue
        out += eng.new_tokens(0)[0]
    assert failures == 1 and out == ref and c.committed == ref


def test_a_failing_commit_callback_fails_the_step_and_the_engine_goes_on(pair):
    target, draft = pair[:2]
    eng = _engine(target, draft, n_seq=2)
    bad = OnlySet(SETS["low"])
    bad.fail_commit_at = 4
    good = OnlySet(SETS["odd"])
    eng.add(0, PROMPTS[0], SamplingParams(max_tokens=20), constraint=bad)
    eng.add(1, PROMPTS[1], SamplingParams(max_tokens=20), constraint=good)
    failed = None
    try:
        while eng.status(0) == "active":
            eng.step()
    except ConstraintError as e:
        assert "commit refused" in str(e)
        failed = e.seq_id
    assert failed == 0
    eng.remove(0)
    while eng.status(1) == "active":
        eng.step()
    assert eng.status(1) == "length"


def test_a_bad_row_count_is_an_error(pair):
    class Bad(OnlySet):
        def fill_masks(self, tokens, out):
            return len(tokens) + 5

    eng = _engine(pair[0])
    with pytest.raises(ConstraintError, match="rows"):
        eng.add(0, PROMPTS[0], SamplingParams(max_tokens=5), constraint=Bad(SETS["low"]))
    assert eng.status(0) == "idle"


def test_an_engine_and_its_contexts_may_be_freed_in_any_order(pair):
    """A callback's exception keeps frames alive in reference cycles, and the cycle collector
    finalizes what they hold in no particular order: a context freed before its engine must not
    leave the engine's stop request pointing into it."""
    import gc

    target, draft = pair[:2]
    for contexts_first in (True, False):
        eng = _engine(target, draft)
        eng.generate(PROMPTS[0], SamplingParams(max_tokens=3))
        closing = [eng.target, eng.draft, eng] if contexts_first else [eng, eng.target, eng.draft]
        for obj in closing:
            obj.close()
    for _ in range(4):  # the engine, its contexts and a cycle: freed together by the collector
        eng = _engine(target, draft)
        eng.generate(PROMPTS[1], SamplingParams(max_tokens=3))
        eng.target.cycle = [eng.target, eng.draft, eng]
        eng.draft.cycle = eng.target.cycle
        del eng
        gc.collect()
