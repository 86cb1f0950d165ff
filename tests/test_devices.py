"""Backend-sensitive paths on every non-CPU device of the build, against the CPU backend as the
reference: target logits, draft tokens / confidences / logits of every draft variant (the views,
the d2t gather and `set_rows` scatter, the Markov chain), greedy speculation, backend sampling,
several sequences. Each test takes `accel` (tests/conftest.py): it runs once per device and is
skipped when the build has none. On a CPU-only machine Vulkan's lavapipe provides one
(tools/vulkan_setup.sh, GGML_VK_VISIBLE_DEVICES=0)."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.model import Model
from dspark_ggml.sampling import SamplingParams
from dspark_ggml.system import devices
from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target
from tests.engine_steps import step_to_end

pytestmark = pytest.mark.device

V = 48
PROMPTS = [[3, 17, 5, 9, 1, 30], [8, 8, 2], [20, 4, 11, 6, 13, 2, 7, 40]]
VARIANTS = {
    "dspark": dict(block_size=4),
    "dflash": dict(kind="dflash", block_size=5),
    "dspark-1+N-rnn": dict(block_size=5, sample_from_anchor=False, markov_head_type="rnn"),
    "reduced-gated": dict(draft_vocab=32, own_head=True, markov_head_type="gated"),
}
# Devices compute in other orders and often with f16 intermediates; on these tiny f32 models the
# logits of lavapipe stay within ~1e-3 of the CPU's (measured), so this leaves a wide margin
# while still catching a wrong view or index (errors of order 1).
ATOL = 2e-2


def _cpu() -> int:
    return next(d.index for d in devices() if d.type == "cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("devices")
    tcfg = TargetConfig(n_vocab=V, n_layer=3, with_tokenizer=False)
    write_target(d / "t.gguf", tcfg, seed=5)
    drafts = {}
    for name, fields in VARIANTS.items():
        write_draft(d / f"{name}.gguf", DraftConfig(**fields), tcfg, seed=11)
        drafts[name] = d / f"{name}.gguf"
    return d / "t.gguf", drafts


def _ctx(model: Model, n_seq: int = 1, **kw) -> Context:
    return Context(model, n_ctx=256, n_seq_max=n_seq, n_batch=64, type_kv="f32", n_threads=2, **kw)


def _all_logits(model: Model, tokens: list[int]) -> np.ndarray:
    c = _ctx(model, n_outputs_max_per_seq=len(tokens))
    c.decode(tokens, outputs=[True] * len(tokens))
    return c.get_logits(copy=True)


def test_target_logits_match_the_cpu(files, accel):
    target, _ = files
    tokens = PROMPTS[2] + PROMPTS[0]
    ref = _all_logits(Model(target, device=_cpu()), tokens)
    got = _all_logits(Model(target, device=accel.index), tokens)
    assert got.shape == ref.shape == (len(tokens), V)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9  # not a trivially small comparison


def _propose(target: Model, draft_path, device: int, n_seqs: int):
    """Inject the same random features for n_seqs sequences and propose one block each."""
    draft = DraftModel(draft_path, target, device=device)
    dc = DraftContext(draft, n_ctx=128, n_seq_max=n_seqs, type_kv="f32", n_threads=2)
    width = len(draft.info.target_layers) * target.n_embd
    feats = np.random.default_rng(7).normal(0, 1, size=(n_seqs, 6, width)).astype(np.float32)
    n = feats.shape[1]
    for s in range(n_seqs):
        dc.inject(feats[s], np.arange(n), s)
    anchors = [PROMPTS[s % 3][-1] for s in range(n_seqs)]
    return dc.propose(anchors, [n] * n_seqs, want_logits=True), draft


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_matches_the_cpu(files, accel, variant):
    """Tokens, confidences and (scattered) logits of one block per sequence, three sequences."""
    target_path, drafts = files
    target = Model(target_path, device=_cpu())
    ref, draft = _propose(target, drafts[variant], _cpu(), 3)
    got, on_dev = _propose(target, drafts[variant], accel.index, 3)
    assert on_dev.device == accel.name and draft.device == "CPU"
    assert ref.tokens.shape == (3, draft.info.max_draft)
    finite = np.isfinite(ref.logits)
    np.testing.assert_array_equal(np.isfinite(got.logits), finite)  # the d2t scatter leaves the same holes
    if variant.startswith("reduced"):
        assert finite.sum() == ref.logits.shape[0] * ref.logits.shape[1] * 32  # 32 draft ids per row
    np.testing.assert_allclose(got.logits[finite], ref.logits[finite], atol=ATOL, rtol=0)
    # tokens: equal up to the first slot whose CPU top-2 gap is within twice the logit error seen
    # here (the chain feeds each pick onward, so later slots may follow a flipped near-tie)
    err = float(np.abs(got.logits[finite] - ref.logits[finite]).max())
    top2 = np.sort(np.where(finite, ref.logits, -np.inf), axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 2 * err + 1e-6
    compared = 0
    for s in range(3):
        k = clear.shape[1] if clear[s].all() else int(np.argmin(clear[s]))
        np.testing.assert_array_equal(got.tokens[s, :k], ref.tokens[s, :k])
        compared += k
    assert compared >= clear.size // 2, f"only {compared} slots compared (logit error {err:g})"
    if ref.confidence is not None:
        np.testing.assert_allclose(got.confidence, ref.confidence, atol=ATOL, rtol=0)
    else:
        assert got.confidence is None

def test_reduced_vocabulary_logits_in_many_contexts_on_the_device(files, accel):
    """The d2t scatter of a reduced-vocabulary draft's logits, again and again in fresh contexts.
    It once ran as a set_rows into a -inf-filled tensor, which on lavapipe corrupted the heap about
    once per three proposals (glibc then aborted the process); now it is a gather and a mask."""
    target_path, drafts = files
    target = Model(target_path, device=_cpu())
    ref, _ = _propose(target, drafts["reduced-gated"], _cpu(), 3)
    for _ in range(25):
        got, _ = _propose(target, drafts["reduced-gated"], accel.index, 3)
        finite = np.isfinite(ref.logits)
        np.testing.assert_array_equal(np.isfinite(got.logits), finite)
        np.testing.assert_allclose(got.logits[finite], ref.logits[finite], atol=ATOL, rtol=0)



def _run(target: Model, draft: DraftModel | None, sp: SamplingParams, n_seq: int = 3, **kw) -> list[list[int]]:
    ctx = _ctx(target, n_seq=n_seq)
    dctx = DraftContext(draft, n_ctx=256, n_seq_max=n_seq, type_kv="f32", n_threads=2) if draft else None
    eng = Engine(ctx, dctx, **kw)
    outs = {s: list(eng.add(s, PROMPTS[s], sp)) for s in range(n_seq)}
    step_to_end(eng, outs)
    return [outs[s] for s in range(n_seq)]


def _top2_gap(target_path, prompt: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| after `prompt`, on the CPU."""
    c = _ctx(Model(target_path, device=_cpu()))
    c.decode(prompt)
    logits = c.get_logits(copy=True)[-1]
    return abs(float(logits[a] - logits[b]))


def _assert_same_but_near_ties(target_path, outs: list[list[int]], expected: list[list[int]]) -> None:
    """Equal outputs, or equal up to a token where the two picks are within the device's logit
    error (a verify batch and a one-token decode take different kernels on a GPU, so a near-tie
    may fall either way; everything after it legitimately differs)."""
    for s, (got, ref) in enumerate(zip(outs, expected)):
        i = next((j for j, (x, y) in enumerate(zip(got, ref)) if x != y), None)
        if i is None:
            assert len(got) == len(ref)
            continue
        gap = _top2_gap(target_path, PROMPTS[s] + ref[:i], got[i], ref[i])
        assert gap < ATOL, f"sequence {s} differs at {i} ({got[i]} vs {ref[i]}), logit gap {gap:.4f}"


@pytest.mark.parametrize("variant", ["dspark", "dflash", "reduced-gated"])
def test_greedy_speculation_equals_target_only_on_the_device(files, accel, variant):
    target_path, drafts = files
    target = Model(target_path, device=accel.index)
    sp = SamplingParams(max_tokens=24)
    expected = _run(target, None, sp)
    _assert_same_but_near_ties(target_path, _run(target, DraftModel(drafts[variant], target), sp), expected)
    _assert_same_but_near_ties(target_path, expected, _run(Model(target_path, device=_cpu()), None, sp))


def test_backend_sampling_draws_what_host_sampling_draws(files, accel):
    """Same seed, same uniforms: the in-graph sampler on the device and the host sampler on the
    device's logits pick the same tokens, with and without a draft."""
    target_path, drafts = files
    target = Model(target_path, device=accel.index)
    draft = DraftModel(drafts["dspark"], target)
    sp = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, max_tokens=24, seed=4321)
    host = _run(target, None, sp, backend_sampling=False)
    assert _run(target, None, sp, backend_sampling=True) == host
    assert _run(target, draft, sp, backend_sampling=True) == host
    assert _run(target, draft, sp, backend_sampling=False) == host


def test_the_adjust_input_of_the_in_graph_sampler_on_the_device(files, accel):
    """A request's additive adjustment (logit bias, presence / frequency penalties) enters the
    device's verify graph as the sampler's adjust input: the same tokens as the host adding it to
    the device's logits, greedy and seeded sampled, with and without a draft."""
    target_path, drafts = files
    target = Model(target_path, device=accel.index)
    draft = DraftModel(drafts["dspark"], target)
    fields = dict(logit_bias={5: 3.0, 9: float("-inf")}, presence_penalty=1.0, frequency_penalty=0.5)
    for sp in (SamplingParams(max_tokens=24, **fields),
               SamplingParams(temperature=0.9, top_k=20, max_tokens=24, seed=99, **fields)):
        host = _run(target, None, sp, backend_sampling=False)
        assert all(9 not in out for out in host)
        assert _run(target, None, sp, backend_sampling=True) == host
        assert _run(target, draft, sp, backend_sampling=True) == host


def test_the_in_graph_sampler_on_the_device_draws_what_the_host_draws(accel):
    """Every on/off combination of the sampler's stages, and one batch mixing them with random
    values and a per-row adjustment (bans as -inf), at uniforms inside one token's share of the
    distribution: the device's graph draws exactly the host chain's tokens."""
    from tests import sampler_reference as ref
    from tests.test_sampler_chain import combos
    from dspark_ggml.sampling import sample_rows

    rng = np.random.default_rng(11)
    rows = 64
    logits = rng.normal(0, 2.5, size=(rows, V)).astype(np.float32)
    for sp in combos():
        u = np.array([ref.safe_uniform(ref.distribution(logits[i], sp)[1], rng)[0] for i in range(rows)], np.float32)
        host, p_host = sample_rows(logits, u, sp, return_probs=True)
        got, p_got = sample_rows(logits, u, sp, device=accel.index, return_probs=True)
        np.testing.assert_array_equal(got, host, err_msg=str(sp))
        np.testing.assert_allclose(p_got, p_host, rtol=1e-3, atol=1e-5)
    mixed = [combos()[i] for i in rng.integers(0, 16, size=rows)]
    adjust = np.where(rng.random(logits.shape) < 0.2, -np.inf, rng.normal(0, 1, size=logits.shape)).astype(np.float32)
    u = np.array([ref.safe_uniform(ref.distribution(logits[i], sp, adjust[i])[1], rng)[0] for i, sp in enumerate(mixed)],
                 np.float32)
    host = sample_rows(logits, u, mixed, adjust=adjust)
    np.testing.assert_array_equal(sample_rows(logits, u, mixed, adjust=adjust, device=accel.index), host)


def test_draft_on_another_device_than_the_target(files, accel):
    """The draft borrows the target's embeddings and head across devices."""
    target_path, drafts = files
    target = Model(target_path, device=_cpu())
    draft = DraftModel(drafts["dspark"], target, device=accel.index)
    assert (target.device, draft.device) == ("CPU", accel.name)
    sp = SamplingParams(max_tokens=24)
    assert _run(target, draft, sp) == _run(target, None, sp)


# ---- batch invariance: a row computed in a batch equals the row computed alone --------------------
# Greedy speculation is lossless only if a verify block's rows come out bit for bit as the decode
# steps they replace (dspark-matmul.h). ggml-vulkan computes up to 8 columns with its mul_mat_vec
# shaders, each column alone, and 9 or more with tiled matmul shaders that add in another order; the
# device's `groups` route splits larger batches into groups of at most 8 columns. A 256-wide tiny
# target in each weight type, made by our own quantize (the K-quants need 256-value rows).

INV_TYPES = ["f16", "q8_0", "q4_0", "q4_K", "q6_K", "iq4_nl"]
INV_TARGET = TargetConfig(n_vocab=1024, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                          with_tokenizer=False)
INV_BATCHES = list(range(1, 18)) + [33]
# Rows from this position on: beyond ggml-vulkan's first flash-attention block of 32 cells, where its
# split of the cells follows the batch's shape (what attention in sequence order replaces).
INV_PREFIX = 40


@pytest.fixture(scope="module")
def inv_models(tmp_path_factory):
    """{type: tiny target in that type}, plus "draft": a DSpark draft with 16-token blocks for it."""
    from dspark_ggml.quantize import quantize_gguf

    d = tmp_path_factory.mktemp("invariance")
    src = d / "f32.gguf"
    write_target(src, INV_TARGET, seed=3)
    out = {"f32": src}
    for t in INV_TYPES:
        quantize_gguf(src, d / f"{t}.gguf", t, pure=True, progress=False)
        out[t] = d / f"{t}.gguf"
    write_draft(d / "draft.gguf", DraftConfig(block_size=16), INV_TARGET, seed=11)
    out["draft"] = d / "draft.gguf"
    return out


def _rows_alone_and_in_batches(model: Model, tokens: list[int], batches: list[int], prefix: int, n_ctx: int = 128,
                               type_kv: str = "f32"):
    """(batch size, row) of every row whose logits in a batch of tokens[prefix:prefix + N] (after the
    prefix, decoded once) differ from the same row decoded alone."""
    ctx = Context(model, n_ctx=n_ctx, n_batch=64, n_threads=2, type_kv=type_kv)
    for i in range(0, prefix, 64):
        ctx.decode(tokens[i:min(prefix, i + 64)])
    alone = []
    for t in tokens[prefix:prefix + max(batches)]:
        ctx.decode([t])
        alone.append(ctx.get_logits(copy=True)[0])
    differ = []
    for n in batches:
        ctx.kv_seq_rm(0, prefix)
        ctx.decode(tokens[prefix:prefix + n], outputs=[True] * n)
        got = ctx.get_logits(copy=True)
        differ += [(n, i) for i in range(n) if not np.array_equal(got[i], alone[i])]
    ctx.close()
    return differ


@pytest.mark.parametrize("type_name", INV_TYPES)
def test_rows_alone_and_in_any_batch_are_bit_identical_on_the_device(inv_models, accel, type_name):
    """Batches of 1..17 and 33 rows (a 33-row batch runs as five groups) at positions 40..72. With
    ggml's flash attention (before attention in sequence order) rows from cell 32 on differed."""
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, INV_TARGET.n_vocab, INV_PREFIX + max(INV_BATCHES))]
    model = Model(inv_models[type_name], device=accel.index)
    assert _rows_alone_and_in_batches(model, tokens, INV_BATCHES, INV_PREFIX) == []


def test_rows_whose_batch_crosses_a_padding_block_are_bit_identical_on_the_device(inv_models, accel):
    """A verify block that attends over more padded cells than the decode steps of its first rows,
    at the device's block edge: on CUDA at 1020..1036 over 1536 cells where they had 1024, elsewhere
    at 250..266 over 512 where they had 256 (the padding adds exact zeros)."""
    prefix = 1020 if accel.name.startswith("CUDA") else 250
    tokens = [int(t) for t in np.random.default_rng(8).integers(0, INV_TARGET.n_vocab, prefix + 20)]
    model = Model(inv_models["q4_K"], device=accel.index)
    assert _rows_alone_and_in_batches(model, tokens, [9, 17], prefix, n_ctx=prefix + 32) == []


def test_a_sequences_rows_do_not_depend_on_where_its_cells_lie_on_the_device(inv_models, accel):
    """One sequence's logits alone in a cache, and with another sequence's 70 cells ahead of its own
    (its cells then start at 128), decoded in batches with the other sequence's tokens."""
    model = Model(inv_models["q4_K"], device=accel.index)
    rng = np.random.default_rng(9)
    mine = [int(t) for t in rng.integers(0, INV_TARGET.n_vocab, 50)]
    other = [int(t) for t in rng.integers(0, INV_TARGET.n_vocab, 80)]

    alone = Context(model, n_ctx=256, n_batch=64, n_threads=2, type_kv="f32")
    alone.decode(mine[:40])
    ref = []
    for t in mine[40:]:
        alone.decode([t])
        ref.append(alone.get_logits(copy=True)[0])
    alone.close()

    shared = Context(model, n_ctx=256, n_seq_max=2, n_batch=64, n_threads=2, type_kv="f32")
    shared.decode(other[:35], seq_ids=1)
    shared.decode(other[35:70], seq_ids=1)
    shared.decode(mine[:40], seq_ids=0)
    got = []
    for i, t in enumerate(mine[40:]):  # each step with one token of the other sequence
        shared.decode([other[70 + i], t], positions=[70 + i, 40 + i], seq_ids=[1, 0], outputs=[False, True])
        got.append(shared.get_logits(copy=True)[0])
    shared.close()
    assert [i for i in range(len(ref)) if not np.array_equal(got[i], ref[i])] == []


@pytest.mark.parametrize("type_name", ["q4_0", "q4_K"])  # (the draft is slow on lavapipe: two types)
def test_greedy_speculation_is_token_identical_on_the_device(inv_models, accel, type_name):
    """16-token verify blocks against one-token decode steps, with no near-tie allowance, well past
    the first 32 KV cells: two prompts alone, and both in one engine (their blocks in one verify
    batch). Without the groups route the second prompt differs at its 10th token on q4_0 (lavapipe)."""
    model = Model(inv_models[type_name], device=accel.index)
    sp = SamplingParams(max_tokens=56)
    prompts = [[3, 17, 5, 9, 1, 30, 2, 8], [700, 12, 96, 4]]
    draft = DraftModel(inv_models["draft"], model)

    def run(d, batch: list[list[int]]) -> list[list[int]]:
        ctx = _ctx(model, n_seq=len(batch))
        eng = Engine(ctx, DraftContext(d, n_ctx=256, n_seq_max=len(batch), type_kv="f32", n_threads=2) if d else None)
        outs = [list(eng.add(i, p, sp)) for i, p in enumerate(batch)]
        while any(eng.status(i) == "active" for i in range(len(batch))):
            eng.step()
            for i in range(len(batch)):
                outs[i] += eng.new_tokens(i)[0]
        if d:  # verify blocks longer than the device's exact batches (8 columns)
            st = eng.stats(0)
            assert st.n_drafted >= 8 * st.n_steps, (st.n_drafted, st.n_steps)
        return outs

    want = [run(None, [p])[0] for p in prompts]
    assert all(len(w) == sp.max_tokens for w in want)
    assert [run(draft, [p])[0] for p in prompts] == want
    assert run(draft, prompts) == want


# ---- placement (runs on any build) -----------------------------------------------------------------

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from dspark_ggml.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_draft_goes_where_it_is_told(files, capsys):
    import json

    target_path, drafts = files
    cpu = str(_cpu())
    base = ["generate", "-m", str(target_path), "-md", str(drafts["dspark"]), "--prompt-tokens", "3,17,5",
            "-n", "4", "-t", "1", "--json"]
    rc, out, err = _cli(capsys, *base, "--device", cpu, "-devd", cpu)
    assert rc == 0, err
    d = json.loads(out)
    assert (d["device"], d["draft_device"]) == ("CPU", "CPU")
    assert "t.gguf on CPU + dspark.gguf on CPU" in err
    n = len(devices())
    rc, _, err = _cli(capsys, *base, "-devd", str(n))
    assert rc != 0 and f"device index {n} out of range" in err


def test_the_draft_defaults_to_the_targets_device(files):
    target_path, drafts = files
    target = Model(target_path, device=_cpu())
    assert DraftModel(drafts["dflash"], target).device == target.device == "CPU"
