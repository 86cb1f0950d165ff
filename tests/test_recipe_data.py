"""The draft recipe's data stages (tools/train_draft/data.py) on the tiny pair's target: the teacher
kept at capture is the target's own next-token distribution, checked against numpy's log-softmax
of the runtime's logits for each sequence decoded alone; the features are what a lone decode
captures; and the training loss reads that teacher over the draft vocabulary as a numpy
reference does."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dspark_ggml as dg  # noqa: E402
from tiny_pair import TARGET_PATH  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "tools" / "train_draft"
sys.path.insert(0, str(RECIPE))
for _name in ("data", "training", "draft_model", "gguf_target"):  # tests/data is a namespace package
    _module = sys.modules.get(_name)
    if _module is not None and Path(getattr(_module, "__file__", None) or "/").parent != RECIPE:
        del sys.modules[_name]
import data  # noqa: E402
import training  # noqa: E402

PROMPTS = [{"id": f"p{i}", "text": text, "kind": "code", "split": "train"} for i, text in enumerate(
    ["def add(a, b):", "import os\nimport sys", "class Stack:", "for i in range(10):", "x = [1, 2, 3]"])]
CAPTURE_IDS = [1, 3]
TOP_K = 8


@pytest.fixture(scope="module")
def recipe_data(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("recipe"))
    data.generate(TARGET_PATH, folder, PROMPTS, max_new=20, max_prompt=64, sampled_per_prompt=1, t_lo=0.7,
                  t_hi=1.0, n_seq_max=4, threads=1, shard_size=4)
    # small batches: several sequences share a decode, and the 10 sequences take several decodes
    n_embd = dg.Model(TARGET_PATH).n_embd
    prog = data.capture(TARGET_PATH, folder, PROMPTS, capture_ids=CAPTURE_IDS, n_embd=n_embd, threads=1,
                        n_batch=96, n_seq_max=3, top_k=TOP_K)
    return folder, prog, data.open_dataset(folder, n_embd)


def alone(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logits of every position and the captured features of one sequence decoded by itself."""
    model = dg.Model(TARGET_PATH)
    ctx = dg.Context(model, n_ctx=256, n_batch=256, n_threads=1)
    ctx.set_capture_layers(CAPTURE_IDS)
    ctx.decode(tokens, outputs=np.ones(len(tokens), np.int8))
    logits, feats = ctx.get_logits(copy=True), ctx.get_captured(copy=True)
    ctx.close()
    model.close()
    return logits, feats


def test_capture_keeps_the_targets_top_k_next_token_logprobs(recipe_data):
    _, prog, ds = recipe_data
    assert prog["finished"] and prog["teacher_top_k"] == TOP_K and len(ds.offsets) == 10
    for s in range(len(ds.offsets)):
        a, n = int(ds.offsets[s]), int(ds.lengths[s])
        logits, feats = alone(ds.tokens[a:a + n])
        np.testing.assert_array_equal(ds.feats[a:a + n], feats.astype(np.float16))
        lm = ds.loss_mask[a:a + n].astype(bool)
        follows = np.zeros(n, bool)
        follows[:-1] = lm[1:]
        lp = logits.astype(np.float64)
        lp = lp - lp.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        ids, logp = ds.teacher_ids[a:a + n], ds.teacher_logp[a:a + n]
        for p in range(n):
            if not follows[p]:
                assert not ids[p].any() and not logp[p].any(), f"seq {s} pos {p}: a teacher where none needed"
                continue
            want = np.argsort(-lp[p], kind="stable")[:TOP_K]
            np.testing.assert_array_equal(np.sort(ids[p]), np.sort(want), err_msg=f"seq {s} pos {p}")
            np.testing.assert_allclose(logp[p], lp[p, ids[p]], atol=2e-5, err_msg=f"seq {s} pos {p}")
            assert np.all(np.diff(logp[p]) <= 0), "kept in decreasing order"
        assert follows.any(), f"seq {s}: no position where an answer token follows"


def test_capture_reports_the_tail_mass_past_top_k(recipe_data):
    _, prog, ds = recipe_data
    rows = np.nonzero(data.teacher_positions(ds.loss_mask, ds.lengths))[0]
    tail = 1.0 - np.exp(ds.teacher_logp[rows].astype(np.float64)).sum(-1)
    assert np.all(tail >= -1e-5) and np.all(tail < 1)
    assert prog["teacher_tail_mass"]["mean"] == pytest.approx(tail.mean(), abs=1e-4)


def test_teacher_positions_stop_at_each_sequence_end():
    # sequences of 3 and 5 tokens; the second's first token is marked so that only the
    # sequence boundary keeps the first's last position out
    mask = np.array([0, 1, 1, 1, 0, 1, 1, 1], np.uint8)
    got = data.teacher_positions(mask, np.array([3, 5]))
    np.testing.assert_array_equal(got, [1, 1, 0, 0, 1, 1, 1, 0])


def test_teacher_probs_scatter_onto_the_draft_vocabulary():
    rng = np.random.default_rng(3)
    V, Vd, K = 50, 12, 6
    vocab_ids = np.sort(rng.choice(V, Vd, replace=False))
    t2d = training.make_t2d(torch.from_numpy(vocab_ids), V)
    ids = np.stack([rng.choice(V, K, replace=False) for _ in range(4)])
    logp = np.log(rng.dirichlet(np.ones(K + 1), size=4)[:, :K]).astype(np.float32)
    got = training.teacher_probs(t2d, torch.from_numpy(ids), torch.from_numpy(logp), Vd).numpy()
    want = np.zeros((4, Vd))
    for r in range(4):
        for i, lp in zip(ids[r], logp[r]):
            if i in vocab_ids:
                want[r, np.searchsorted(vocab_ids, i)] += np.exp(lp)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_loss_reads_the_kept_teacher(recipe_data):
    """dspark_loss's total variation on real captured blocks equals numpy's from the same draft
    probabilities and the kept top-k (with the mass past it counted as missed)."""
    from draft_model import DraftConfig, DSparkDraft

    _, _, ds = recipe_data
    model = dg.Model(TARGET_PATH)
    V, E = model.n_vocab, model.n_embd
    head_dim = E // model.n_head
    vocab_ids = np.unique(ds.tokens)  # the top-k also holds tokens outside it: they count as missed
    cfg = DraftConfig(vocab_size=V, draft_vocab_size=len(vocab_ids), hidden_size=E, intermediate_size=2 * E,
                      num_hidden_layers=1, num_attention_heads=model.n_head,
                      num_key_value_heads=model.n_head_kv,
                      head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1e4, capture_ids=CAPTURE_IDS,
                      num_target_layers=model.n_layer, block_size=4, mask_token_id=V - 1, markov_rank=8)
    torch.manual_seed(0)
    draft = DSparkDraft(cfg)
    draft.set_vocab(torch.from_numpy(vocab_ids), torch.randn(V, E) * 0.02, torch.randn(V, E) * 0.02)
    ids = np.arange(len(ds.offsets))
    tok, lm, fe, ti, tl = ds.batch(ids)
    lens = ds.lengths[ids]
    gen = torch.Generator().manual_seed(1)
    anc = [training.sample_anchors(lm[i, :lens[i]], 4, gen) for i in range(len(ids))]
    blocks = training.build_blocks(tok, lm, lens, anc, cfg.block_size, cfg.mask_token_id)
    t2d = training.make_t2d(draft.vocab_ids, V)
    with torch.no_grad():
        loss, stats = training.dspark_loss(draft, t2d, fe, ti, tl, blocks, cfg.block_size)
        bids, pos, prev, lab, val, an, _ = blocks
        N, S, _ = fe.shape
        ctx_kv = draft.context_kv(fe, torch.arange(S)[None].expand(N, S))
        h = draft.backbone(bids, pos, ctx_kv, training.attn_mask(an, S, cfg.block_size))
        pd = torch.softmax(draft.heads(h, prev)[0], -1).double().numpy()
    assert np.isfinite(loss.item())
    pos, val = pos.numpy(), val.numpy()
    k = np.arange(pos.shape[1]) % cfg.block_size
    w = np.exp(-k / training.DECAY)[None] * val
    tv = np.zeros(val.shape)
    for n in range(N):
        for j in np.nonzero(val[n])[0]:
            p = int(ds.offsets[n]) + pos[n, j]
            pt = np.zeros(len(vocab_ids))
            for i, lp in zip(ds.teacher_ids[p], ds.teacher_logp[p]):
                if i in vocab_ids:
                    pt[np.searchsorted(vocab_ids, i)] += np.exp(float(lp))
            tv[n, j] = 0.5 * (np.abs(pd[n, j] - pt).sum() + max(0.0, 1.0 - pt.sum()))
    assert w.sum() > 0
    assert stats["tv"] == pytest.approx((tv * w).sum() / w.sum(), rel=1e-4)
    assert 0 < stats["tv"] <= 1
    # the layers in bf16 (heads and loss in f32) give nearly the same loss on the same blocks
    with torch.no_grad():
        loss16, _ = training.dspark_loss(draft, t2d, fe, ti, tl, blocks, cfg.block_size, bf16_body=True)
    assert loss16.dtype == torch.float32 and loss16.item() == pytest.approx(loss.item(), rel=0.02)
