"""Gemma-4 (dense, per-layer embeddings, mixture of experts, the text part of the multimodal
model), Gemma-3 and Qwen3-MoE targets against Hugging Face transformers.

The checkpoints are tiny random models made with transformers (tests/hf_checkpoints.py), converted
by our converter (whose output test_convert_interop.py checks against llama.cpp's), and run by the
runtime. Sequences are longer than the Gemma sliding window (8), so the window mask, the shared
KV layers and rollback across the window edge are all exercised.

ggml's CPU GELU reads a float16 table (its input rounded to float16, the result stored as float16),
about 5e-4 relative per activation. The 1e-3 logit comparison therefore runs transformers with the
same rounding of the GELU (nothing else changed); greedy generation is compared with transformers
as it is.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the HF cross-check needs the `reference` extra (torch, transformers)")
transformers = pytest.importorskip("transformers")

from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.errors import DSparkError  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402
from tests.repack_check import assert_repacking_computes_the_same  # noqa: E402
from tests.tiny_models import greedy_decode  # noqa: E402

torch.set_grad_enabled(False)

from new_archs import CASES, GEMMA, SLIDING, WINDOW, converted  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """case -> (HF directory, f32 GGUF path), built on first use and shared by the session."""
    root = tmp_path_factory.getbasetemp() / "new_archs"
    root.mkdir(exist_ok=True)
    return lambda case: converted(root, case)


class _Float16TableGelu(torch.nn.Module):
    """GELU (tanh) as ggml's CPU backend computes it: input and output rounded to float16, and
    exact outside (-10, 10)."""

    def forward(self, x):
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def _hf_model(hf_dir: Path, ggml_gelu: bool = False):
    m = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    if ggml_gelu:
        for mod in list(m.modules()):
            act = getattr(mod, "act_fn", None)
            if act is not None and "gelu" in type(act).__name__.lower():
                mod.act_fn = _Float16TableGelu()
    return m


def _hf_logits(m, tokens: list[int]) -> np.ndarray:
    # output_hidden_states: transformers 5.24 slices missing per-layer inputs of KV-shared Gemma-4
    # layers otherwise (a bug of its prefill shortcut); the logits are the same.
    return m(input_ids=torch.tensor([tokens]), output_hidden_states=True).logits[0].numpy()


def _prompt(n: int, seed: int, n_vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab - 1, size=n)]


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(models, case):
    hf_dir, path = models(case)
    model = Model(path)
    prompt = _prompt(3 * WINDOW, 1, model.n_vocab)
    ctx = Context(model, n_ctx=128, type_kv="f32")
    ctx.decode(prompt, np.arange(len(prompt)), outputs=np.ones(len(prompt), bool))
    ref = _hf_logits(_hf_model(hf_dir, ggml_gelu=True), prompt)
    assert np.abs(ctx.get_logits() - ref).max() <= 1e-3


@pytest.mark.parametrize("case", CASES)
def test_greedy_generation_matches_transformers(models, case):
    hf_dir, path = models(case)
    model = Model(path)
    prompt = _prompt(6, 2, model.n_vocab)
    m = _hf_model(hf_dir)
    seq, expected = list(prompt), []
    for _ in range(40):  # past the window several times
        expected.append(int(_hf_logits(m, seq)[-1].argmax()))
        seq.append(expected[-1])
    ctx = Context(model, n_ctx=128, type_kv="f32")
    assert greedy_decode(ctx, prompt, 40) == expected


@pytest.mark.parametrize("case", CASES)
def test_batch_of_sequences_equals_single_runs(models, case):
    _, path = models(case)
    model = Model(path)
    V = model.n_vocab
    prompts = [_prompt(n, 10 + n, V) for n in (5, 2 * WINDOW + 3, WINDOW)]
    single = []
    for p in prompts:
        ctx = Context(model, n_ctx=128, type_kv="f32")
        ctx.decode(p, np.arange(len(p)), outputs=np.ones(len(p), bool))
        single.append(ctx.get_logits(copy=True))
    ctx = Context(model, n_ctx=128, n_seq_max=3, type_kv="f32")
    tokens = np.concatenate(prompts)
    pos = np.concatenate([np.arange(len(p)) for p in prompts])
    seq = np.concatenate([np.full(len(p), i) for i, p in enumerate(prompts)])
    ctx.decode(tokens, pos, seq, outputs=np.ones(len(tokens), bool))
    batched = ctx.get_logits()
    start = 0
    for p, ref in zip(prompts, single):
        np.testing.assert_allclose(batched[start:start + len(p)], ref, atol=1e-4)
        start += len(p)


@pytest.mark.parametrize("case", SLIDING)
def test_rollback_across_the_window_edge_is_exact(models, case):
    """Decode past the window, drop the last tokens (as a rejected draft is dropped), decode others:
    the logits equal those of a fresh context that only ever saw the kept and the new tokens."""
    _, path = models(case)
    model = Model(path)
    V = model.n_vocab
    kept, rejected, new = _prompt(2 * WINDOW - 2, 20, V), _prompt(5, 21, V), _prompt(4, 22, V)
    ctx = Context(model, n_ctx=128, type_kv="f32")
    ctx.decode(kept + rejected)
    ctx.kv_seq_rm(0, len(kept))
    ctx.decode(new, np.arange(len(kept), len(kept) + len(new)), outputs=np.ones(len(new), bool))
    fresh = Context(model, n_ctx=128, type_kv="f32")
    fresh.decode(kept + new, outputs=np.r_[np.zeros(len(kept), bool), np.ones(len(new), bool)])
    np.testing.assert_allclose(ctx.get_logits(), fresh.get_logits(), atol=1e-5)


@pytest.mark.parametrize("case", GEMMA)
def test_every_layer_can_be_captured_for_a_draft(models, case):
    """The residual stream entering each layer equals transformers' hidden state there, and
    capturing all layers at once equals capturing each alone."""
    hf_dir, path = models(case)
    model = Model(path)
    prompt = _prompt(12, 3, model.n_vocab)
    n_layer = model.n_layer
    ctx = Context(model, n_ctx=64, type_kv="f32")
    ctx.set_capture_layers(list(range(n_layer + 1)))
    ctx.decode(prompt)
    all_layers = ctx.get_captured(copy=True).reshape(len(prompt), n_layer + 1, -1)
    m = _hf_model(hf_dir, ggml_gelu=True)
    hidden = m(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    for il in range(n_layer):  # transformers' hidden_states[il] is the input of layer il
        np.testing.assert_allclose(all_layers[:, il], hidden[il][0].numpy(), rtol=2e-3, atol=2e-3)
    for il in (0, n_layer // 2, n_layer):
        one = Context(model, n_ctx=64, type_kv="f32")
        one.set_capture_layers([il])
        one.decode(prompt)
        np.testing.assert_allclose(one.get_captured().reshape(len(prompt), -1), all_layers[:, il], atol=1e-6)


def _corrupt(path: Path, out: Path, **kw) -> Path:
    return rewrite_gguf(path, out, **kw)


def test_bad_gemma4_files_name_the_key(models, tmp_path):
    _, dense = models("gemma4-dense")
    _, moe = models("gemma4-moe")
    cases = [
        (dense, dict(set_keys={"gemma4.attention.shared_kv_layers": 6}), "shared_kv_layers"),
        (dense, dict(drop_keys=("gemma4.attention.sliding_window",)), "sliding_window"),
        (moe, dict(set_keys={"gemma4.expert_used_count": 9}), "expert_used_count"),
        (moe, dict(set_keys={"gemma4.expert_count": 3}), "ffn_gate_inp"),
        (dense, dict(set_keys={"gemma4.attention.key_length_swa": 7}), "key_length_swa"),
    ]
    for i, (src, edit, word) in enumerate(cases):
        bad = _corrupt(src, tmp_path / f"bad{i}.gguf", **edit)
        with pytest.raises(DSparkError, match=word):
            Model(bad)


def test_sliding_window_pattern_of_the_wrong_length_is_refused(models, tmp_path):
    import gguf

    _, dense = models("gemma4-dense")
    key = "gemma4.attention.sliding_window_pattern"
    pattern = [bool(x) for x in gguf.GGUFReader(dense).fields[key].contents()]
    bad = _corrupt(dense, tmp_path / "pattern.gguf", set_keys={key: pattern[:-1]})
    with pytest.raises(DSparkError, match="sliding_window_pattern"):
        Model(bad)


def test_qwen3moe_expert_counts_must_fit(models, tmp_path):
    _, path = models("qwen3moe")
    cases = [("qwen3moe.expert_used_count", 0, "expert_used_count"),
             ("qwen3moe.expert_used_count", 9, "expert_used_count"),
             ("qwen3moe.expert_count", 16, "ffn_gate_inp"),
             ("qwen3moe.expert_feed_forward_length", 33, "expert_feed_forward_length")]
    for i, (key, value, word) in enumerate(cases):
        bad = _corrupt(path, tmp_path / f"q{i}.gguf", set_keys={key: value})
        with pytest.raises(DSparkError, match=word):
            Model(bad)


@pytest.mark.parametrize("case", ["gemma4-moe", "qwen3moe"])
def test_repacked_expert_weights_compute_the_same(models, case, tmp_path):
    """On the CPU the 3-D expert stacks are repacked for ggml_mul_mat_id like the 2-D weights."""
    from dspark_ggml.convert import convert

    hf_dir, _ = models(case)
    path = tmp_path / f"{case}.q8_0.gguf"
    convert(hf_dir, path, outtype="q8_0", progress=False)
    assert_repacking_computes_the_same(path, [5, 17, 42, 99, 7, 12, 33, 60, 2, 11])


@pytest.mark.parametrize("case", ["gemma4-moe", "qwen3moe"])
def test_bf16_experts_give_a_row_the_same_bits_in_any_batch(models, case, tmp_path):
    """bf16 experts (on AMX-BF16 tiles where the CPU has them: each expert's columns together, every
    batch by one tile program; elsewhere one row at a time): a token's logits in a verify-like
    block of 9 and beside another sequence's rows are the bits of its decode step, and near the f32
    model's."""
    from dspark_ggml.convert import convert

    hf_dir, f32_path = models(case)
    path = tmp_path / f"{case}.bf16.gguf"
    convert(hf_dir, path, outtype="bf16", progress=False)
    model = Model(path)
    V = model.n_vocab
    prompt, block, other = _prompt(12, 1, V), _prompt(9, 2, V), _prompt(6, 3, V)
    ctx = Context(model, n_ctx=128, n_seq_max=2, type_kv="f32")
    ctx.decode(prompt)
    ctx.decode(other, np.arange(len(other)), np.ones(len(other), int))
    alone = []
    for t in block:
        ctx.decode([t])
        alone.append(ctx.get_logits(copy=True)[0])
    alone = np.stack(alone)
    ctx.kv_seq_rm(0, len(prompt))
    ctx.decode(block, outputs=np.ones(len(block), bool))
    assert np.array_equal(ctx.get_logits(copy=True).view(np.uint32), alone.view(np.uint32))
    ctx.kv_seq_rm(0, len(prompt))
    tokens = np.concatenate([other[:3], block])
    pos = np.concatenate([np.arange(len(other), len(other) + 3), np.arange(len(prompt), len(prompt) + len(block))])
    seq = np.concatenate([np.ones(3, int), np.zeros(len(block), int)])
    ctx.decode(tokens, pos, seq, outputs=np.concatenate([np.zeros(3, bool), np.ones(len(block), bool)]))
    assert np.array_equal(ctx.get_logits(copy=True).view(np.uint32), alone.view(np.uint32))
    ref = Context(Model(f32_path), n_ctx=128, type_kv="f32")
    ref.decode(np.concatenate([prompt, block]), outputs=np.ones(len(prompt) + len(block), bool))
    want = ref.get_logits(copy=True)[len(prompt):]
    assert np.abs(alone - want).max() <= 0.15 * want.std()  # bf16 weights and columns
