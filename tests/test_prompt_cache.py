"""Prompt caching in the engine: a sequence started with reuse_prefix keeps the cells its slot
already holds of its prompt and prefills the rest, and its output is the same as after a full
prefill (cells computed earlier are bit-identical to recomputed ones), greedy and seeded sampled,
with and without the draft; cells record their tokens, so stale ones never count."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import InvalidArgumentError
from dspark_ggml.model import Model
from dspark_ggml.sampling import SamplingParams
from dspark_ggml.tokenizer import Tokenizer
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH

N_BATCH = 32  # small: a cached prefix and a full prefill split the prompt into different batches
TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    for name in sorted(os.listdir(argv[1])):\n" \
       "        path = os.path.join(argv[1], name)\n        if os.path.isdir(path):\n" \
       "            print(path, len(os.listdir(path)))\n    return 0\n\n\nclass Stack:\n"


@pytest.fixture(scope="module")
def models():
    target = Model(TARGET_PATH)
    draft = DraftModel(DRAFT_PATH, target)
    yield target, draft, Tokenizer.from_gguf(TARGET_PATH)
    draft.close()
    target.close()


@pytest.fixture(scope="module")
def prompt(models):
    return models[2].encode(TEXT)


def _contexts(models, draft: bool):
    target, dmodel, _ = models
    ctx = Context(target, n_ctx=512, n_batch=N_BATCH, n_seq_max=2, n_threads=1, batch_invariant=True)
    dctx = DraftContext(dmodel, n_ctx=512, n_batch=N_BATCH, n_seq_max=2, n_threads=1, batch_invariant=True) \
        if draft else None
    return ctx, dctx


def _run(engine: Engine, seq_id: int, prompt, sp: SamplingParams, reuse: bool) -> list[int]:
    out = list(engine.add(seq_id, prompt, sp, reuse_prefix=reuse))
    while engine.status(seq_id) == "active":
        engine.step()
        out += engine.new_tokens(seq_id)[0]
    return out


def other_than(token: int) -> int:
    return (token + 1) % 4096


SAMPLINGS = {"greedy": SamplingParams(max_tokens=24),
             "sampled": SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=7)}


@pytest.mark.parametrize("draft_mode", [None, "greedy", "probabilistic"])
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_cached_prefix_gives_the_output_of_a_full_prefill(models, prompt, draft_mode, sampling):
    sp = SAMPLINGS[sampling]
    fresh_ctx, fresh_dctx = _contexts(models, draft_mode is not None)
    cached_ctx, cached_dctx = _contexts(models, draft_mode is not None)
    kw = {"draft_mode": draft_mode} if draft_mode else {}
    fresh = Engine(fresh_ctx, fresh_dctx, **kw)
    cached = Engine(cached_ctx, cached_dctx, **kw)
    try:
        expected = _run(fresh, 0, prompt, sp, reuse=False)
        # an earlier request: the first 41 tokens of the prompt, then its own continuation
        head = prompt[:41]
        _run(cached, 1, head + [other_than(prompt[41])], SAMPLINGS["greedy"], reuse=False)
        cached.detach(1)
        assert cached.cached_prefix(1, prompt) == 41
        assert _run(cached, 1, prompt, sp, reuse=True) == expected
        assert cached.stats(1).n_cached == 41
        # the same prompt again: all of it but the last token comes from the cache
        cached.detach(1)
        assert cached.cached_prefix(1, prompt) == len(prompt) - 1
        assert _run(cached, 1, prompt, sp, reuse=True) == expected
        assert cached.stats(1).n_cached == len(prompt) - 1
    finally:
        for e in (fresh, cached):
            e.close()
        for c in (fresh_ctx, fresh_dctx, cached_ctx, cached_dctx):
            if c is not None:
                c.close()


def test_cached_target_rows_are_bit_identical(models, prompt):
    """The claim the cache rests on: logits after a prefix decoded earlier equal those of one
    decode of the whole prompt, bit for bit."""
    ctx, _ = _contexts(models, False)
    try:
        _prefill(ctx, prompt, 0, N_BATCH)
        whole = ctx.get_logits(copy=True)[-1]
        _prefill(ctx, prompt, 1, 10)  # other batches: as after a hit on 10 tokens
        assert np.array_equal(ctx.get_logits(copy=True)[-1], whole)
    finally:
        ctx.close()


def _prefill(ctx: Context, tokens, seq_id: int, first: int) -> None:
    """Decode ``tokens`` in batches: ``first`` tokens, then N_BATCH at a time."""
    bounds = [0, *range(first, len(tokens), N_BATCH), len(tokens)]
    for a, b in zip(bounds, bounds[1:]):
        ctx.decode(tokens[a:b], positions=np.arange(a, b, dtype=np.int32), seq_ids=seq_id)


def test_stale_cells_never_count(models, prompt):
    """A target-only engine over the same contexts rewrites a slot's target cells and leaves its
    draft cells behind: the drafting engine then reuses only what both caches hold of the prompt."""
    ctx, dctx = _contexts(models, True)
    plain = Engine(ctx, None)
    drafting = Engine(ctx, dctx)  # second: a draftless engine turns the target's feature capture off
    try:
        sp = SamplingParams(max_tokens=4)
        _run(drafting, 0, prompt, sp, reuse=False)
        drafting.detach(0)
        other = prompt[:20] + [other_than(prompt[20])] * 30
        _run(plain, 0, other, sp, reuse=True)  # keeps 20 target cells, rewrites the rest
        plain.detach(0)
        assert plain.cached_prefix(0, other) == len(other) - 1
        assert drafting.cached_prefix(0, other) == 20  # the draft's cells after 20 are the old prompt's
        assert drafting.cached_prefix(0, prompt) == 20  # the target's are the new one's
        ctx.kv.seq_rm(0)
        assert drafting.cached_prefix(0, prompt) == 0
    finally:
        plain.close()
        drafting.close()
        dctx.close()
        ctx.close()


def test_bad_input(models, prompt):
    ctx, _ = _contexts(models, False)
    engine = Engine(ctx)
    try:
        with pytest.raises(InvalidArgumentError):
            engine.cached_prefix(2, prompt)
        with pytest.raises(InvalidArgumentError):
            engine.detach(0)  # no such sequence
        assert engine.cached_prefix(0, []) == 0
        assert engine.cached_prefix(0, [1]) == 0
    finally:
        engine.close()
        ctx.close()


def test_a_prefix_is_kept_only_where_the_continuation_stays_in_its_block(models, prompt):
    """Cells shared with another sequence (seq_cp, as the server shares a common prefix) or that
    sequence's own cells in the rest of a block would split the continuation across blocks: the
    prefix is then kept in whole blocks of 64 positions, and the output stays that of a fresh run."""
    prompt = prompt + prompt  # two blocks and more
    ctx, _ = _contexts(models, False)
    engine = Engine(ctx)
    sp = SamplingParams(max_tokens=8, temperature=0.9, seed=3)
    try:
        _run(engine, 0, prompt, sp, reuse=False)
        engine.detach(0)
        ctx.kv.seq_cp(0, 1, 0, 70)  # seq 1 shares positions 0 .. 69; seq 0's 70.. follow in the block
        assert engine.cached_prefix(0, prompt) == len(prompt) - 1
        assert engine.cached_prefix(0, prompt[:50] + [other_than(prompt[50])]) == 0  # 50 .. 63 are shared
        assert engine.cached_prefix(1, prompt[:70] + [other_than(prompt[70])]) == 64  # 70 .. 127 are seq 0's
        tail = prompt[:70] + [other_than(prompt[70])] * 12
        fresh_ctx, _ = _contexts(models, False)
        fresh = Engine(fresh_ctx)
        try:
            expected = _run(fresh, 0, tail, sp, reuse=False)
        finally:
            fresh.close()
            fresh_ctx.close()
        assert _run(engine, 1, tail, sp, reuse=True) == expected
        assert engine.stats(1).n_cached == 64
    finally:
        engine.close()
        ctx.close()
