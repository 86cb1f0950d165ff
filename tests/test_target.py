"""The target runtime against the independent numpy reference (tests/reference/numpy_target.py)."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.errors import AbortedError, ContextFullError, InvalidArgumentError
from dspark_ggml.model import Model
from tests.reference.numpy_target import TargetRef
from tests.repack_check import assert_repacking_computes_the_same

ARCHS = ["qwen3", "llama", "qwen2"]
PROMPT = np.array([3, 17, 42, 99, 5, 260, 7, 1, 64, 128, 31], dtype=np.int32)


def _ctx(path, **kw) -> tuple[Model, Context]:
    m = Model(path)
    kw.setdefault("n_ctx", 256)
    kw.setdefault("type_kv", "f32")
    return m, Context(m, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_logits_and_features_match_numpy(make_target, arch):
    path, w, cfg = make_target(f"t_{arch}", arch=arch)
    m, ctx = _ctx(path)
    layers = list(range(cfg.n_layer + 1))
    ctx.set_capture_layers(layers)
    ctx.decode(PROMPT, outputs=np.ones(len(PROMPT), bool))
    ref_logits, ref_inputs = TargetRef(w, cfg).forward(PROMPT, np.arange(len(PROMPT)))
    assert np.abs(ctx.get_logits() - ref_logits).max() <= 1e-3
    ref_feat = np.concatenate([ref_inputs[i] for i in layers], axis=1)
    assert np.abs(ctx.get_captured() - ref_feat).max() <= 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_64_tokens_match_numpy(make_target, arch):
    path, w, cfg = make_target(f"t_{arch}", arch=arch)
    m, ctx = _ctx(path)
    ref = TargetRef(w, cfg)
    expected = ref.generate_greedy(PROMPT.tolist(), 64)
    ctx.decode(PROMPT)
    got = []
    for _ in range(64):
        tok = int(np.argmax(ctx.get_logits()[-1]))
        got.append(tok)
        ctx.decode([tok])
    assert got == list(expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_matches_one_shot(make_target, arch):
    path, w, cfg = make_target(f"t_{arch}", arch=arch)
    m, ctx = _ctx(path)
    ref = TargetRef(w, cfg)
    ref_all, _ = ref.forward(PROMPT, np.arange(len(PROMPT)))
    ctx.decode(PROMPT[:4])
    for i in range(4, len(PROMPT)):
        ctx.decode(PROMPT[i:i + 1])
        assert np.abs(ctx.get_logits()[0] - ref_all[i]).max() <= 1e-3


def test_multi_sequence_batch_equals_each_sequence_alone(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    prompts = [PROMPT[:5], PROMPT[2:11], PROMPT[::-1][:7]]
    m, ctx = _ctx(path, n_seq_max=3, type_kv="f16")
    # prefill all three in one interleaved batch, then one more token each, again in one batch
    toks, pos, seq = [], [], []
    for i in range(9):
        for s, p in enumerate(prompts):
            if i < len(p):
                toks.append(p[i]), pos.append(i), seq.append(s)
    ctx.decode(toks, pos, seq, outputs=np.ones(len(toks), bool))
    batched = ctx.get_logits(copy=True)
    nxt = [11, 12, 13]
    ctx.decode(nxt, [len(p) for p in prompts], [0, 1, 2], outputs=[1, 1, 1])
    batched_next = ctx.get_logits(copy=True)

    for s, p in enumerate(prompts):
        _, alone = _ctx(path, type_kv="f16")
        alone.decode(p, outputs=np.ones(len(p), bool))
        rows = [i for i, q in enumerate(seq) if q == s]
        assert np.abs(batched[rows] - alone.get_logits()).max() <= 1e-4
        alone.decode([nxt[s]])
        assert np.abs(batched_next[s] - alone.get_logits()[0]).max() <= 1e-4


def test_rollback_with_seq_rm_then_redecode(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m, ctx = _ctx(path)
    ctx.decode(PROMPT)
    first = ctx.get_logits(copy=True)
    ctx.decode([5, 6, 7])  # e.g. three rejected draft tokens
    ctx.kv_seq_rm(0, len(PROMPT))
    assert ctx.kv_seq_pos_max(0) == len(PROMPT) - 1
    ctx.kv_seq_rm(0, len(PROMPT) - 1)
    ctx.decode(PROMPT[-1:])
    assert np.abs(ctx.get_logits() - first).max() <= 1e-5


def test_seq_cp_shares_a_prompt(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    ref = TargetRef(w, cfg)
    m, ctx = _ctx(path, n_seq_max=2)
    ctx.decode(PROMPT)
    used = ctx.kv_n_used
    ctx.kv_seq_cp(0, 1)
    assert ctx.kv_n_used == used  # shared, not copied
    n = len(PROMPT)
    ctx.decode([8, 9], [n, n], [0, 1], outputs=[1, 1])
    ref.forward(PROMPT, np.arange(n))
    for s, tok in enumerate([8, 9]):
        r = TargetRef(w, cfg)
        r.forward(PROMPT, np.arange(n))
        lg, _ = r.forward([tok], [n])
        assert np.abs(ctx.get_logits()[s] - lg[0]).max() <= 1e-3
    ctx.kv_seq_rm(1)
    assert ctx.kv_seq_pos_max(1) == -1 and ctx.kv_seq_pos_max(0) == n


@pytest.mark.parametrize("variant", [
    dict(rope_scaling=("linear", 4.0)),
    dict(rope_scaling=("yarn", 4.0, 512)),
    dict(arch="llama", rope_freqs=True),
    dict(tied_embeddings=True),
    dict(n_head_kv=1),
    dict(n_head_kv=4),
])
def test_model_variants_match_numpy(make_target, variant):
    name = "v_" + "_".join(f"{k}{v}" for k, v in variant.items()).replace(" ", "").replace("'", "")
    path, w, cfg = make_target(name, **variant)
    m, ctx = _ctx(path, n_ctx=512)
    pos = np.arange(len(PROMPT)) + 300  # far enough for scaling to matter
    ctx.decode(PROMPT, pos, outputs=np.ones(len(PROMPT), bool))
    ref_logits, _ = TargetRef(w, cfg).forward(PROMPT, pos)
    assert np.abs(ctx.get_logits() - ref_logits).max() <= 1e-3


@pytest.mark.parametrize("dtype,tol", [("f16", 0.02), ("bf16", 0.05), ("q8_0", 0.05), ("q4_0", 0.15),
                                       ("q4_k", 0.15), ("q5_k", 0.1), ("q6_k", 0.08)])
def test_weight_types_load_and_run(make_target, dtype, tol):
    # quantized matmuls also quantize the activations, so the bound is relative to the logit scale
    path, w, cfg = make_target(f"q_{dtype}", dtype=dtype, n_embd=256, n_ff=512, head_dim=64)
    m, ctx = _ctx(path)
    ctx.decode(PROMPT, outputs=np.ones(len(PROMPT), bool))
    ref_logits, _ = TargetRef(w, cfg).forward(PROMPT, np.arange(len(PROMPT)))
    err = np.abs(ctx.get_logits() - ref_logits).max() / ref_logits.std()
    assert err <= tol
    assert (ctx.get_logits().argmax(1) == ref_logits.argmax(1)).mean() >= 0.8


@pytest.mark.parametrize("dtype", ["q4_0", "q4_k"])
def test_repacked_weights_compute_the_same(make_target, dtype):
    path, w, cfg = make_target(f"q_{dtype}", dtype=dtype, n_embd=256, n_ff=512, head_dim=64)
    assert_repacking_computes_the_same(path, PROMPT)


def test_flash_and_plain_attention_agree(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    out = []
    for fa in (True, False):
        m, ctx = _ctx(path, flash_attn=fa)
        assert ctx.params.flash_attn is fa
        ctx.decode(PROMPT, outputs=np.ones(len(PROMPT), bool))
        out.append(ctx.get_logits(copy=True))
    assert np.abs(out[0] - out[1]).max() <= 1e-4


# ---- bad input: a clear error and the KV cache as it was ------------------------------------------

def _state(ctx: Context) -> tuple[int, int]:
    return ctx.kv_n_used, ctx.kv_seq_pos_max(0)


@pytest.mark.parametrize("bad,match", [
    (dict(tokens=[1, 320]), "token 320 at batch index 1 is outside the vocabulary"),
    (dict(tokens=[-1]), "token -1"),
    (dict(tokens=[1], positions=[64]), "position 64 .* n_ctx"),
    (dict(tokens=[1], positions=[3]), "position 3 of sequence 0 .* follow the cached ones"),
    (dict(tokens=[1, 2], positions=[20, 20]), "positions must increase"),
    (dict(tokens=[1], positions=[20], seq_ids=[2]), "sequence id 2"),
    (dict(tokens=[1], positions=[20], seq_ids=[-1]), "sequence id -1"),
    (dict(tokens=list(range(17)), positions=list(range(20, 37))), "batch of 17 tokens"),
    (dict(tokens=[1, 2, 3], positions=[20, 21, 22], outputs=[1, 1, 1]), "n_outputs_max_per_seq"),
])
def test_bad_batches_are_refused_and_change_nothing(make_target, bad, match):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m, ctx = _ctx(path, n_ctx=64, n_batch=16, n_seq_max=2, n_outputs_max_per_seq=2)
    ctx.decode(PROMPT)
    before = _state(ctx)
    with pytest.raises(InvalidArgumentError, match=match):
        ctx.decode(**bad)
    assert _state(ctx) == before
    ctx.decode([4])  # still usable, and consistent with a clean run
    _, clean = _ctx(path, n_ctx=64)
    clean.decode(np.append(PROMPT, 4))
    assert np.abs(ctx.get_logits() - clean.get_logits()).max() <= 1e-5


def test_full_cache_is_refused_and_changes_nothing(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m, ctx = _ctx(path, n_ctx=16, n_seq_max=2)
    ctx.decode(PROMPT)  # 11 of 16 cells
    before = _state(ctx)
    with pytest.raises(ContextFullError, match="KV cache is full"):
        ctx.decode(list(range(6)), seq_ids=1)
    assert _state(ctx) == before and ctx.kv_seq_pos_max(1) == -1
    ctx.decode(list(range(5)), seq_ids=1)  # exactly fits


def test_unknown_capture_layer(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m, ctx = _ctx(path)
    with pytest.raises(InvalidArgumentError, match=r"layer id 3 out of range.*0..2"):
        ctx.set_capture_layers([0, 3])


def test_abort_leaves_the_context_usable(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m, ctx = _ctx(path)
    ctx.decode(PROMPT[:3])
    before = _state(ctx)
    ctx.set_abort_callback(lambda: True)
    with pytest.raises(AbortedError):
        ctx.decode(PROMPT[3:])
    assert _state(ctx) == before
    ctx.set_abort_callback(None)
    ctx.decode(PROMPT[3:])
    ref_logits, _ = TargetRef(w, cfg).forward(PROMPT, np.arange(len(PROMPT)))
    assert np.abs(ctx.get_logits()[-1] - ref_logits[-1]).max() <= 1e-3


def test_context_parameters_are_validated(make_target):
    path, w, cfg = make_target("t_qwen3", arch="qwen3")
    m = Model(path)
    with pytest.raises(InvalidArgumentError, match="n_seq_max"):
        Context(m, n_seq_max=1000)
    with pytest.raises(InvalidArgumentError, match="type_kv"):
        Context(m, type_kv="q3")
    ctx = Context(m, n_ctx=0)
    assert ctx.n_ctx == cfg.n_ctx_train


def test_reused_graphs_give_bit_identical_logits(make_target):
    """Decode steps of one shape run the previous graph again; its logits are bit for bit those
    of a freshly built graph (a context whose every graph is new: capture changes force it)."""
    path, _, _ = make_target("reuse", arch="qwen3")
    model = Model(path)
    prompt = [3, 17, 42, 99, 5, 260, 7]
    steps = [11, 12, 13, 14, 15]
    reusing = Context(model, n_ctx=64, type_kv="f32")
    fresh = Context(model, n_ctx=64, type_kv="f32")
    reusing.decode(prompt)
    fresh.decode(prompt)
    for i, t in enumerate(steps):
        pos = [len(prompt) + i]
        reusing.decode([t], pos)
        fresh.set_capture_layers([i % 2])  # a new capture list: the next graph is built anew
        fresh.decode([t], pos)
        assert np.array_equal(reusing.get_logits(), fresh.get_logits())
    built, reused = reusing.graph_counts()
    assert reused >= len(steps) - 1 and built <= 2  # prompt graph, then one decode graph for all steps
    assert fresh.graph_counts()[1] == 0


@pytest.mark.parametrize("flash", [False, True])
def test_a_sequence_gets_the_same_logits_whatever_its_neighbours_did(make_target, flash):
    """A sequence's cells are placed above its own at index = position (mod 64): its attention
    meets them in position order at the same SIMD lanes as alone, so logits are equal bit for bit
    whatever its neighbours did (here another sequence came first, grew and shrank in between)."""
    path, _, _ = make_target("cell_order", arch="qwen3")
    model = Model(path)
    a, b = [3, 17, 42, 99, 5], [8, 8, 2, 60, 61, 9, 10]
    alone = Context(model, n_ctx=256, type_kv="f32", flash_attn=flash)
    alone.decode(a + [11, 12, 13], np.arange(8), outputs=np.ones(8, bool))
    mixed = Context(model, n_ctx=256, n_seq_max=2, type_kv="f32", flash_attn=flash)
    mixed.decode(b, np.arange(7), [1] * 7)
    mixed.decode(a, np.arange(5), [0] * 5)
    mixed.decode([11, 40], [5, 7], [0, 1])
    mixed.kv_seq_rm(1, 2)  # frees cells below A's newest
    mixed.decode([12, 13], [6, 7], [0, 0], outputs=[True, True])
    assert np.array_equal(mixed.get_logits(), alone.get_logits()[6:8])


def _rows_of_seq0(model, mates, n_query, n_cached, **options):
    """Seq 0's logits for n_query new tokens after n_cached, decoded in one batch with `mates` other
    sequences (each n_query tokens after a cache of its own length)."""
    ctx = Context(model, n_ctx=2048, n_seq_max=16, n_threads=2, type_kv="f16", **options)  # 2: a split cache
    rng = np.random.default_rng(1)
    for s in range(mates + 1):
        n = n_cached if s == 0 else 20 + 9 * s
        for off in range(0, n, 256):
            m = min(256, n - off)
            ctx.decode(rng.integers(1, 200, m), np.arange(off, off + m), s)
    tok, pos, seq = [], [], []
    for s in range(mates + 1):
        start = ctx.kv_seq_pos_max(s) + 1
        tok += [7 + s + j for j in range(n_query)]
        pos += list(range(start, start + n_query))
        seq += [s] * n_query
    ctx.decode(tok, pos, seq, outputs=np.ones(len(tok), bool))
    return ctx.get_logits(copy=True)[:n_query]


@pytest.mark.parametrize("n_query,n_cached", [(9, 40), (1, 600)])
def test_batch_invariant_kernels_give_a_row_the_same_logits_in_any_batch(make_target, n_query, n_cached):
    """With flash attention ggml's CPU picks kernels by batch shape (a tiled one from 64 queries, a
    split over the cache for one query over >= 512 cells), which round differently; batch_invariant
    keeps the row-by-row kernel, so a verify block decodes the same alone and in a batch of 8.
    (q8_0 weights: an f32 matmul of one row rounds unlike one of several, with or without this.)"""
    path, _, _ = make_target("batch_invariant_q8_0", arch="qwen3", dtype="q8_0")
    model = Model(path)
    alone = _rows_of_seq0(model, 0, n_query, n_cached, flash_attn=True, batch_invariant=True)
    for mates in (1, 7):
        mixed = _rows_of_seq0(model, mates, n_query, n_cached, flash_attn=True, batch_invariant=True)
        assert np.array_equal(mixed, alone), f"{mates} batch mates: max |diff| {np.abs(mixed - alone).max()}"


def test_batch_invariant_is_reported_in_the_params(make_target):
    path, _, _ = make_target("batch_invariant", arch="qwen3")
    model = Model(path)
    assert Context(model, n_ctx=64, batch_invariant=True).params.batch_invariant is True
    assert Context(model, n_ctx=64).params.batch_invariant is False


def test_a_tied_head_runs_from_a_repacked_copy_and_computes_the_same(make_target):
    """Tied embeddings are both gathered (rows must stay plain) and the lm head (a matmul the CPU
    repacks): the head gets a repacked copy; the logits agree with the unrepacked model."""
    path, _, _ = make_target("tied_q4_0", dtype="q4_0", n_embd=256, n_ff=512, head_dim=64, tied_embeddings=True)
    assert_repacking_computes_the_same(path, PROMPT)
