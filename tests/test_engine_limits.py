"""Limits that must work rather than throw or abort: a verify batch larger than the context's
n_batch (split into several decodes), and in-graph sampling for many sequences (the graph's node
budget grows with them). Each sequence must come out as it does alone."""
from __future__ import annotations

import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import AbortedError, ContextFullError
from dspark_ggml.sampling import SamplingParams
from tests.tiny_models import DraftConfig, write_draft, write_id_target
from tests.engine_steps import step_to_end

V = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    tcfg, target = write_id_target(d, V, n_layer=3)
    write_draft(d / "d.gguf", DraftConfig(block_size=6), tcfg, seed=11)
    write_draft(d / "d8.gguf", DraftConfig(block_size=8), tcfg, seed=12)
    return target, DraftModel(d / "d.gguf", target), DraftModel(d / "d8.gguf", target)


def _prompt(i: int) -> list[int]:
    return [(7 * i + 3 * j + 1) % V for j in range(3 + i % 5)]


def _sampling(i: int) -> SamplingParams:
    if i % 2 == 0:
        return SamplingParams(max_tokens=12)
    return SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05, max_tokens=12, seed=100 + i)


def _engine(target, draft, n_seq, n_batch, **kw) -> Engine:
    ctx = Context(target, n_ctx=64 * n_seq, n_seq_max=n_seq, n_batch=n_batch, type_kv="f32", n_threads=1)
    dctx = DraftContext(draft, n_ctx=64 * n_seq, n_seq_max=n_seq, type_kv="f32", n_threads=1) if draft else None
    return Engine(ctx, dctx, **kw)


def _run_all(eng: Engine, n: int) -> list[list[int]]:
    outs = [list(eng.add(s, _prompt(s), _sampling(s))) for s in range(n)]
    step_to_end(eng, outs)
    return outs


def _alone(target, draft, i: int, **kw) -> list[int]:
    return _engine(target, draft, 1, 64, **kw).generate(_prompt(i), _sampling(i))


def test_verify_batch_larger_than_n_batch_is_split(pair):
    target, draft, _ = pair
    n = 64
    eng = _engine(target, draft, n, n_batch=100)  # 64 x (6 + 1) verify rows, 100 per decode
    assert n * (eng.n_draft + 1) > 4 * 100
    outs = _run_all(eng, n)
    assert outs == [_alone(target, draft, i) for i in range(n)]
    assert eng.stats().n_drafted > 0


def test_default_n_batch_with_64_sequences(pair):
    """The case seen with the demo pair: 64 sequences x a block of 8 + 1 > the default n_batch 512."""
    target, _, draft8 = pair
    n = 64
    ctx = Context(target, n_ctx=64 * n, n_seq_max=n, type_kv="f32", n_threads=1)
    eng = Engine(ctx, DraftContext(draft8, n_ctx=64 * n, n_seq_max=n, type_kv="f32", n_threads=1))
    assert n * (eng.n_draft + 1) > 512
    outs = _run_all(eng, n)
    assert outs == [_alone(target, draft8, i) for i in range(n)]


def test_abort_in_a_split_step_leaves_every_sequence_as_before(pair):
    target, draft, _ = pair
    n = 16
    eng = _engine(target, draft, n, n_batch=24)
    for s in range(n):
        eng.add(s, _prompt(s), _sampling(s))
    eng.step()
    before = [eng.stats(s).n_generated for s in range(n)]
    eng.set_abort_callback(lambda: True)
    with pytest.raises(AbortedError):
        eng.step()
    assert [eng.stats(s).n_generated for s in range(n)] == before
    eng.set_abort_callback(None)
    outs = [[] for _ in range(n)]
    step_to_end(eng, outs)
    for i in (0, 1, 15):  # the rest of each sequence as if nothing had happened
        assert outs[i] == _alone(target, draft, i)[-len(outs[i]):]


@pytest.mark.parametrize("with_draft", [True, False])
def test_backend_sampling_for_32_sequences(pair, with_draft):
    target, draft, _ = pair
    draft = draft if with_draft else None
    n = 32
    eng = _engine(target, draft, n, n_batch=512, backend_sampling=True)
    outs = _run_all(eng, n)
    assert outs == [_alone(target, draft, i) for i in range(n)]  # alone: host sampling


def test_a_split_step_that_cannot_get_its_cells_changes_nothing(pair):
    """16 sequences x 7 verify rows need 112 cells, 52 are free: the step refuses as a whole
    (ContextFullError) before any chunk commits."""
    target, draft, _ = pair
    n = 16
    ctx = Context(target, n_ctx=100, n_seq_max=n, n_batch=24, type_kv="f32", n_threads=1)
    eng = Engine(ctx, DraftContext(draft, n_ctx=100, n_seq_max=n, type_kv="f32", n_threads=1))
    for s in range(n):
        eng.add(s, [1 + s % 5, 2, 3], SamplingParams(max_tokens=40))
    before = [(eng.stats(s).n_generated, eng.new_tokens(s)[0]) for s in range(n)]
    used = ctx.kv_n_used
    with pytest.raises(ContextFullError, match="the verify batch needs 112"):
        eng.step()
    assert ctx.kv_n_used == used
    assert [eng.stats(s).n_generated for s in range(n)] == [b[0] for b in before]
