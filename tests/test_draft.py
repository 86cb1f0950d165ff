"""The DFlash / DSpark draft runtime against the numpy reference (tests/reference/numpy_draft.py)."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.errors import FileFormatError, InvalidArgumentError
from dspark_ggml.model import Model
from tests.gguf_edit import rewrite_gguf
from tests.tiny_models import DraftConfig, TargetConfig, write_draft
from tests.reference.numpy_draft import DraftRef

TARGET = dict(n_layer=4)
PROMPTS = [np.array([3, 17, 42, 99, 5, 260, 7, 1, 64, 128, 31], np.int32),
           np.array([9, 8, 7, 6, 5], np.int32),
           np.array([100, 200, 300, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], np.int32)]

VARIANTS = {
    "dflash": dict(kind="dflash", block_size=5),
    "dspark-anchor-first": dict(),
    "dspark-1+N": dict(sample_from_anchor=False, block_size=5),
    "reduced-vocab": dict(draft_vocab=100, own_head=True),
    "reduced-vocab-self-contained": dict(draft_vocab=100, own_head=True, own_embeddings=True, markov_head_type="gated"),
    "gated": dict(markov_head_type="gated"),
    "rnn": dict(markov_head_type="rnn"),
    "rnn-1+N": dict(markov_head_type="rnn", sample_from_anchor=False),
    "no-confidence": dict(confidence_head=False),
    "scales": dict(fc_scale=True, markov_w2_scale=True, n_layer=2),
    "gemma-style": dict(shared_kv=True, post_norms=True, layer_output_scale=True, hidden_activation="gelu_pytorch_tanh",
                        embedding_scale=8.0, attention_scale=1.0, value_scale=0.5),
    "gemma-softcap": dict(shared_kv=True, post_norms=True, hidden_activation="gelu_pytorch_tanh", embedding_scale=8.0,
                          attention_scale=1.0, logit_softcap=0.5),
    "sliding-window": dict(n_layer=2, sliding_window=4, sliding_window_pattern=[True, False]),
    "causal": dict(causal=True),
}


@pytest.fixture(scope="module")
def target(make_target):
    return make_target("draft_target", **TARGET)


def _draft(tmp_path, target, name, **fields):
    tpath, tw, tcfg = target
    dcfg = DraftConfig(**fields)
    dw = write_draft(tmp_path / f"{name}.gguf", dcfg, tcfg, seed=7)
    t = Model(tpath)
    return t, DraftModel(tmp_path / f"{name}.gguf", t), DraftRef(dw, dcfg, tw, tcfg)


def _features(t: Model, layers, prompts) -> list[np.ndarray]:
    ctx = Context(t, n_ctx=128, type_kv="f32")
    ctx.set_capture_layers(layers)
    out = []
    for p in prompts:
        ctx.kv_clear()
        ctx.decode(p, outputs=np.zeros(len(p), bool) | (np.arange(len(p)) == len(p) - 1))
        out.append(ctx.get_captured(copy=True))
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_block_matches_numpy_for_three_sequences_at_once(tmp_path, target, variant):
    t, d, _ = _draft(tmp_path, target, variant, **VARIANTS[variant])
    feats = _features(t, d.info.target_layers, PROMPTS)
    dctx = DraftContext(d, n_ctx=128, n_seq_max=3, type_kv="f32")
    # inject the three contexts in one interleaved batch
    rows, pos, seq = [], [], []
    for i in range(max(len(p) for p in PROMPTS)):
        for s, f in enumerate(feats):
            if i < len(f):
                rows.append(f[i]), pos.append(i), seq.append(s)
    dctx.inject(np.stack(rows), pos, seq)
    anchors = [77, 5, 250]
    pos0 = [len(p) for p in PROMPTS]
    prop = dctx.propose(anchors, pos0, want_logits=True)
    first = d.info.block_size - d.info.max_draft
    assert prop.tokens.shape == (3, d.info.max_draft)
    for s in range(3):
        ref = _draft(tmp_path, target, variant, **VARIANTS[variant])[2]
        ref.inject(feats[s], np.arange(len(PROMPTS[s])))
        r = ref.propose(anchors[s], pos0[s], d.info.block_size)
        assert prop.tokens[s].tolist() == r["tokens"][first:].tolist()
        rl = r["logits"][first:]
        finite = np.isfinite(rl)
        assert (np.isfinite(prop.logits[s]) == finite).all()  # a reduced vocab leaves -inf rows
        assert np.abs(prop.logits[s][finite] - rl[finite]).max() <= 1e-3
        if r["confidence"] is not None:
            assert np.abs(prop.confidence[s] - r["confidence"][first:]).max() <= 1e-4
        else:
            assert prop.confidence is None


def test_shorter_blocks_and_unchanged_cache(tmp_path, target):
    t, d, ref = _draft(tmp_path, target, "short")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128, type_kv="f32")
    dctx.inject(feats, np.arange(len(feats)))
    ref.inject(feats, np.arange(len(feats)))
    used = dctx.kv.n_used
    for n in range(1, d.info.max_draft + 1):
        p = dctx.propose([42], [len(feats)], n_draft=n)
        assert p.tokens[0].tolist() == ref.propose(42, len(feats), n)["tokens"].tolist()
        assert dctx.kv.n_used == used  # block cells are temporary


def test_an_aborted_propose_leaves_the_draft_cache_as_it_was(tmp_path, target):
    from dspark_ggml.errors import AbortedError

    t, d, ref = _draft(tmp_path, target, "abort")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128, type_kv="f32")
    dctx.inject(feats[:6], np.arange(6))
    before = dctx.propose([42], [6]).tokens
    used = dctx.kv.n_used
    dctx.set_abort_callback(lambda: True)
    with pytest.raises(AbortedError):
        dctx.propose([42], [6])
    with pytest.raises(AbortedError):
        dctx.inject(feats[6:], np.arange(6, len(feats)))
    assert dctx.kv.n_used == used
    dctx.set_abort_callback(None)
    assert dctx.propose([42], [6]).tokens.tolist() == before.tolist()


def test_rollback_then_reinject(tmp_path, target):
    t, d, ref = _draft(tmp_path, target, "rollback")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128, type_kv="f32")
    dctx.inject(feats, np.arange(len(feats)))
    before = dctx.propose([1], [len(feats)]).tokens
    dctx.kv.seq_rm(0, 6)  # rejected positions
    dctx.inject(feats[6:], np.arange(6, len(feats)))
    assert dctx.propose([1], [len(feats)]).tokens.tolist() == before.tolist()


def test_sampling_is_seeded(tmp_path, target):
    t, d, _ = _draft(tmp_path, target, "sampled")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128)
    dctx.inject(feats, np.arange(len(feats)))
    a = dctx.propose([1], [len(feats)], temperature=1.0, seed=3).tokens
    b = dctx.propose([1], [len(feats)], temperature=1.0, seed=3).tokens
    draws = {tuple(dctx.propose([1], [len(feats)], temperature=2.0, seed=s).tokens[0]) for s in range(20)}
    assert a.tolist() == b.tolist() and len(draws) > 1


def _chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square goodness of fit, categories with expected counts below 5 pooled into one."""
    from scipy import stats

    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


@pytest.mark.parametrize("variant", ["dflash", "dspark-anchor-first", "reduced-vocab"])
def test_sampled_slots_follow_the_draft_distribution(tmp_path, target, variant):
    """Slots are drawn in-graph from softmax(logits / T) at one uniform each: over many seeds the
    draws of the first two slots match the distributions of the logits each call reports (for
    DSpark the second slot's logits depend on the first draw: the chain), and `probs` is each
    drawn token's probability. Chi-square per slot, alpha = 1e-3."""
    t, d, _ = _draft(tmp_path, target, variant, **VARIANTS[variant])
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128, type_kv="f32")
    dctx.inject(feats, np.arange(len(feats)))
    T, N, V = 1.5, 2500, t.n_vocab
    observed, expected = np.zeros((2, V)), np.zeros((2, V))
    for seed in range(N):
        prop = dctx.propose([1], [len(feats)], n_draft=2, temperature=T, seed=seed, want_logits=True)
        for j in range(2):
            z = prop.logits[0, j] / T
            p = np.exp(z - z.max())
            p /= p.sum()
            x = prop.tokens[0, j]
            assert prop.probs[0, j] == pytest.approx(p[x], rel=1e-4, abs=1e-7)
            observed[j, x] += 1
            expected[j] += p
    for j in range(2):
        assert _chi2_pvalue(observed[j], expected[j]) > 1e-3


# ---- bad input -------------------------------------------------------------------------------------

def test_draft_for_a_mismatched_target(tmp_path, target, make_target):
    tpath, tw, tcfg = target
    write_draft(tmp_path / "d.gguf", DraftConfig(), TargetConfig(**TARGET), seed=1)
    wide = Model(make_target("wide", n_layer=4, n_embd=96)[0])
    with pytest.raises(InvalidArgumentError, match="hidden size mismatch.*n_embd 64.*96"):
        DraftModel(tmp_path / "d.gguf", wide)
    shallow = Model(make_target("shallow", n_layer=2)[0])
    with pytest.raises(InvalidArgumentError, match="reads target layer 3 but the target .* has layers 0..2"):
        DraftModel(tmp_path / "d.gguf", shallow)
    other_vocab = Model(make_target("vocab400", n_layer=4, n_vocab=400)[0])
    write_draft(tmp_path / "own.gguf", DraftConfig(own_embeddings=True), TargetConfig(**TARGET), seed=1)
    with pytest.raises(InvalidArgumentError, match="vocabulary mismatch"):
        DraftModel(tmp_path / "own.gguf", other_vocab)
    with pytest.raises(InvalidArgumentError, match="load it with its target"):
        DraftModel(tmp_path / "d.gguf", None)
    with pytest.raises(InvalidArgumentError, match="not a DFlash/DSpark draft"):
        DraftModel(tpath, Model(tpath))


def test_missing_mask_token_and_bad_d2t(tmp_path, target):
    import gguf

    tpath, tw, tcfg = target
    src = tmp_path / "src.gguf"
    write_draft(src, DraftConfig(draft_vocab=50, own_head=True), tcfg, seed=1)
    r = gguf.GGUFReader(src)

    def rewrite(dst, drop_key=None, d2t=None):
        return rewrite_gguf(src, dst, drop_keys=(drop_key,) if drop_key else (),
                            tensors={"d2t": np.asarray(d2t, dtype=np.int64)} if d2t is not None else None)

    t = Model(tpath)
    with pytest.raises(FileFormatError, match="mask_token_id"):
        DraftModel(rewrite(tmp_path / "nomask.gguf", drop_key="tokenizer.ggml.mask_token_id"), t)
    good_d2t = np.array(r.tensors[[x.name for x in r.tensors].index("d2t")].data)
    out_of_range = good_d2t.copy()
    out_of_range[3] = 320
    with pytest.raises(FileFormatError, match=r"d2t\[3\] = 320 is outside the target vocabulary"):
        DraftModel(rewrite(tmp_path / "d2t_range.gguf", d2t=out_of_range), t)
    dup = good_d2t.copy()
    dup[4] = dup[5]
    with pytest.raises(FileFormatError, match="d2t maps two draft ids"):
        DraftModel(rewrite(tmp_path / "d2t_dup.gguf", d2t=dup), t)


def test_bad_inject_and_propose_calls(tmp_path, target):
    t, d, _ = _draft(tmp_path, target, "bad")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=64, n_seq_max=2)
    dctx.inject(feats, np.arange(len(feats)))
    used = dctx.kv.n_used
    with pytest.raises(InvalidArgumentError, match="width"):
        dctx.inject(feats[:, :10], [20] * len(feats))
    with pytest.raises(InvalidArgumentError, match="must follow the injected ones"):
        dctx.inject(feats[:2], [3, 4])
    with pytest.raises(InvalidArgumentError, match="sequence id 5"):
        dctx.inject(feats[:1], [30], 5)
    with pytest.raises(InvalidArgumentError, match=r"n_draft = 5: this draft proposes 1 .. 4"):
        dctx.propose([1], [len(feats)], n_draft=5)  # a block longer than the trained block size
    with pytest.raises(InvalidArgumentError, match="positions >= the anchor position"):
        dctx.propose([1], [5])
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        dctx.propose([999], [len(feats)])
    with pytest.raises(InvalidArgumentError, match="must be unique"):
        dctx.propose([1, 2], [len(feats), len(feats)], [0, 0])
    with pytest.raises(InvalidArgumentError, match="does not fit in n_ctx"):
        dctx.propose([1], [62], [1])
    assert dctx.kv.n_used == used
    assert dctx.propose([1], [len(feats)]).tokens.shape == (1, 4)


def test_anchor_first_dflash_drafts_predict_from_every_slot(tmp_path, target):
    """DeepSpec's DFlash checkpoints are anchor-first too; the converter writes the layout for every
    draft, and the runtime honours it (absent, a DFlash draft is 1+N as in llama.cpp)."""
    from tests.gguf_edit import rewrite_gguf

    tpath, tw, tcfg = target
    dcfg = DraftConfig(kind="dflash", block_size=5)
    dw = write_draft(tmp_path / "src.gguf", dcfg, tcfg, seed=7)
    rewrite_gguf(tmp_path / "src.gguf", tmp_path / "af.gguf", set_keys={"dflash.sample_from_anchor": True})
    t = Model(tpath)
    d = DraftModel(tmp_path / "af.gguf", t)
    assert d.info.max_draft == 5 and d.info.sample_from_anchor
    assert DraftModel(tmp_path / "src.gguf", t).info.max_draft == 4
    assert DraftModel(tmp_path / "src.gguf", t, sample_from_anchor=True).info.max_draft == 5  # override
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    dctx = DraftContext(d, n_ctx=128, type_kv="f32")
    dctx.inject(feats, np.arange(len(feats)))
    ref = DraftRef(dw, dcfg, tw, tcfg)
    ref.inject(feats, np.arange(len(feats)))
    r = ref.propose(9, len(feats), 5)
    assert dctx.propose([9], [len(feats)]).tokens[0].tolist() == r["tokens"].tolist()


def test_layer_offset_override(tmp_path, target):
    tpath, tw, tcfg = target
    write_draft(tmp_path / "d.gguf", DraftConfig(target_layers=[1, 2]), tcfg, seed=7)
    t = Model(tpath)
    assert DraftModel(tmp_path / "d.gguf", t, layer_offset=1).info.target_layers == (2, 3)
    with pytest.raises(InvalidArgumentError, match="reads target layer 5"):
        DraftModel(tmp_path / "d.gguf", t, layer_offset=3)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_markov_top_k_equals_exact_when_k_covers_the_vocabulary(tmp_path, target, head):
    t, d, _ = _draft(tmp_path, target, f"topk-{head}", markov_head_type=head, draft_vocab=100, own_head=True)
    feats = _features(t, d.info.target_layers, PROMPTS)
    dctx = DraftContext(d, n_ctx=256, n_seq_max=3, type_kv="f32")
    for s, f in enumerate(feats):
        dctx.inject(f, np.arange(len(f)), s)
    args = ([77, 5, 250], [len(p) for p in PROMPTS])
    exact = dctx.propose(*args)
    full = dctx.propose(*args, markov_top_k=100)  # every draft token is a candidate: the same chain
    assert full.tokens.tolist() == exact.tokens.tolist()
    assert np.abs(full.confidence - exact.confidence).max() < 1e-5
    few = dctx.propose(*args, markov_top_k=3)
    assert few.tokens.shape == exact.tokens.shape


def test_reused_propose_graphs_give_the_same_proposals(tmp_path, target):
    """A propose of the same shape as the previous one runs its graph again: same tokens and
    confidences as a context whose graph is new (and the reuse is counted)."""
    t, d, _ = _draft(tmp_path, target, "reuse")
    feats = _features(t, d.info.target_layers, PROMPTS[:1])[0]
    reusing, fresh = DraftContext(d, n_ctx=128, type_kv="f32"), DraftContext(d, n_ctx=128, type_kv="f32")
    for c in (reusing, fresh):
        c.inject(feats, np.arange(len(feats)))
    for anchor in (1, 5, 9):
        a = reusing.propose([anchor], [len(feats)])
        fresh.propose([anchor], [len(feats)], n_draft=1)  # another shape: the next graph is new
        b = fresh.propose([anchor], [len(feats)])
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.confidence, b.confidence)
    assert reusing.graph_counts()[1] >= 2 and fresh.graph_counts()[1] == 0


def test_calibrated_confidence_is_the_sigmoid_of_the_logit_over_each_slots_temperature(tmp_path, target):
    """DSpark's sequential temperature scaling: `dflash.confidence_temperatures` (one per predicting
    slot) divides the confidence head's logit before its sigmoid; same tokens, same logits."""
    t, d, _ = _draft(tmp_path, target, "conf-plain")
    temps = [0.5, 1.0, 2.0, 4.0]
    assert d.info.block_size == len(temps)  # anchor-first: every slot predicts
    rewrite_gguf(tmp_path / "conf-plain.gguf", tmp_path / "conf-temp.gguf",
                 set_keys={"dflash.confidence_temperatures": [float(x) for x in temps]})
    dt = DraftModel(tmp_path / "conf-temp.gguf", t)
    feats = _features(t, d.info.target_layers, PROMPTS)
    props = []
    for m in (d, dt):
        dctx = DraftContext(m, n_ctx=256, n_seq_max=3, type_kv="f32")
        for s, f in enumerate(feats):
            dctx.inject(f, np.arange(len(f)), s)
        props.append(dctx.propose([77, 5, 250], [len(p) for p in PROMPTS]))
    plain, scaled = props
    assert plain.tokens.tolist() == scaled.tokens.tolist()
    logit = np.log(plain.confidence) - np.log1p(-plain.confidence)
    want = 1.0 / (1.0 + np.exp(-logit / np.array(temps)))
    assert np.abs(scaled.confidence - want).max() < 1e-5
    assert np.abs(scaled.confidence - plain.confidence).max() > 1e-3  # the temperatures did something
    for bad, why in (([1.0, 1.0], "values for 4"), ([1.0, 0.0, 1.0, 1.0], "not positive")):
        rewrite_gguf(tmp_path / "conf-plain.gguf", tmp_path / "conf-bad.gguf",
                     set_keys={"dflash.confidence_temperatures": bad})
        with pytest.raises(FileFormatError, match=why):
            DraftModel(tmp_path / "conf-bad.gguf", t)
