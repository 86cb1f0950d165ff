"""The graphs a device gets, run on the CPU (DSPARK_DEVICE_RULES=cuda / vulkan): what a CUDA or
Vulkan device computes is laid out for its kernels (attention in sequence order by channels or by
ids, weight products as one column per channel), and those layouts are checked here without a GPU:

- their math against the CPU's own graphs (numpy-free: the CPU path is the reference the rest of
  the suite checks against transformers and llama.cpp),
- batch invariance of their rows (the CPU computes a channel of one column as it computes a decode
  step, as ggml-cuda does),
- the ids of every ggml_mul_mat_id they build against what each backend requires
  (DSPARK_CHECK_MUL_MAT_ID, csrc/src/dspark-mul-mat-id-check.h): ggml-cuda aborts the process on a
  row that repeats an id in its sorting path, which attention in sequence order by ids did on an H200.
"""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import DSparkError
from dspark_ggml.model import Model
from dspark_ggml.quant import cpu_isa
from dspark_ggml.sampling import SamplingParams
from tests.test_devices import _rows_alone_and_in_batches as rows_alone_and_in_batches
from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target

# 4 query heads on 2 KV heads: a token's heads share KV heads, so by ids a row repeats an id.
TARGET = TargetConfig(n_vocab=1024, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                      with_tokenizer=False)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """{"f32", "q8_0", "q4_K": target paths, "draft": a DSpark draft with 16-token blocks}."""
    from dspark_ggml.quantize import quantize_gguf

    d = tmp_path_factory.mktemp("device_rules")
    out = {"f32": d / "f32.gguf"}
    write_target(out["f32"], TARGET, seed=3)
    for t in ("q8_0", "q4_K"):
        out[t] = d / f"{t}.gguf"
        quantize_gguf(out["f32"], out[t], t, pure=True, progress=False)
    out["draft"] = d / "draft.gguf"
    write_draft(out["draft"], DraftConfig(block_size=16), TARGET, seed=11)
    return out


@pytest.fixture
def rules(monkeypatch):
    """rules(name): the CPU builds the graphs of that device from now on ("cpu": its own)."""
    def set_rules(name: str) -> None:
        if name == "cpu":
            monkeypatch.delenv("DSPARK_DEVICE_RULES", raising=False)
        else:
            monkeypatch.setenv("DSPARK_DEVICE_RULES", name)
    return set_rules


def _tokens(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, TARGET.n_vocab, n)]


def _ctx(model: Model, n_seq: int = 1, n_ctx: int = 512) -> Context:
    return Context(model, n_ctx=n_ctx, n_seq_max=n_seq, n_batch=64, n_threads=2, type_kv="f16",
                   n_outputs_max_per_seq=40)


def _two_sequences(model: Model) -> np.ndarray:
    """Logits of a batch holding 3 tokens of sequence 0 and 1 of sequence 1 (uneven slots), after
    prefixes of 300 and 20 tokens (sequence 0's cells span two 256-cell blocks)."""
    a, b = _tokens(1, 303), _tokens(2, 21)
    c = _ctx(model, n_seq=2)
    c.decode(b[:20], seq_ids=1)
    for i in range(0, 300, 60):
        c.decode(a[i:i + 60], seq_ids=0)
    c.decode([a[300], b[20], a[301], a[302]], positions=[300, 20, 301, 302], seq_ids=[0, 1, 0, 0],
             outputs=[True] * 4)
    return c.get_logits(copy=True)


def test_cuda_graphs_compute_what_the_cpu_computes(dense, rules):
    """f32 weights: with quantized ones the activations are rounded to the weights' dot-product
    type, which turns the last-bit differences of two attention orders into whole steps."""
    rules("cpu")
    want = _two_sequences(Model(dense["f32"]))
    rules("cuda")
    got = _two_sequences(Model(dense["f32"]))
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def _rows_alone_and_in_batches(model: Model, tokens: list[int], prefix: int, batches: list[int]) -> list[tuple]:
    return rows_alone_and_in_batches(model, tokens, batches, prefix, n_ctx=prefix + max(batches) + 8, type_kv="f16")


@pytest.mark.parametrize("type_name", ["f32", "q4_K"])
def test_cuda_graphs_give_a_row_the_same_bits_alone_and_in_any_batch(dense, rules, type_name):
    """Positions 40..72, and 1020..1036: there the batches of 9 and 17 rows attend over 1536 padded
    cells where the first rows' decode steps attended over 1024 (CUDA's cells come in blocks of 512,
    at least 1024)."""
    rules("cuda")
    model = Model(dense[type_name])
    tokens = _tokens(8, 1040)
    assert _rows_alone_and_in_batches(model, tokens, 40, [2, 5, 9, 17, 33]) == []
    assert _rows_alone_and_in_batches(model, tokens, 1020, [9, 17]) == []


def test_greedy_speculation_with_cuda_graphs_is_token_identical(dense, rules):
    """Verify blocks of up to 16 tokens (beyond ggml-cuda's 8-column kernels) against one-token decode steps, two prompts in one engine."""
    rules("cuda")
    model = Model(dense["q4_K"])
    draft = DraftModel(dense["draft"], model)
    sp = SamplingParams(max_tokens=40)
    prompts = [_tokens(3, 9), _tokens(4, 5)]

    def run(d) -> list[list[int]]:
        ctx = _ctx(model, n_seq=2)
        eng = Engine(ctx, DraftContext(d, n_ctx=512, n_seq_max=2, type_kv="f16", n_threads=2) if d else None)
        outs = [list(eng.add(i, p, sp)) for i, p in enumerate(prompts)]
        while any(eng.status(i) == "active" for i in range(2)):
            eng.step()
            for i in range(2):
                outs[i] += eng.new_tokens(i)[0]
        if d:
            assert eng.stats(0).n_drafted >= 8 * eng.stats(0).n_steps
        return outs

    want = run(None)
    assert all(len(w) == sp.max_tokens for w in want)
    assert run(draft) == want


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """{"f32", "q8_0": a tiny Qwen3-MoE target} (8 experts, 2 per token, from transformers)."""
    pytest.importorskip("torch", reason="the MoE target is made with transformers (the `reference` extra)")
    from dspark_ggml.quantize import quantize_gguf
    from tests.new_archs import converted

    root = tmp_path_factory.mktemp("device_rules_moe")
    _, f32 = converted(root, "qwen3moe")
    quantize_gguf(f32, root / "q8_0.gguf", "q8_0", pure=True, progress=False)
    return {"f32": f32, "q8_0": root / "q8_0.gguf"}


def _decode_and_verify(model: Model) -> np.ndarray:
    """A prefill, a decode step, a 9-token verify and a batch of two sequences, as logits."""
    c = _ctx(model, n_seq=2)
    toks = [int(t) for t in np.random.default_rng(5).integers(0, 64, 40)]
    c.decode(toks[:20], seq_ids=0)
    c.decode([toks[20]], positions=[20], seq_ids=[0])
    c.decode(toks[21:30], positions=list(range(21, 30)), seq_ids=[0] * 9, outputs=[True] * 9)
    c.decode(toks[30:33], positions=[0, 30, 1], seq_ids=[1, 0, 1], outputs=[True] * 3)
    return c.get_logits(copy=True)


@pytest.mark.parametrize("device", ["cuda", "vulkan"])
def test_every_mul_mat_id_meets_what_its_backend_requires(dense, moe, rules, monkeypatch, device):
    """Attention in sequence order (dense, GQA) and the experts of a MoE target (float and
    quantized), decode steps, a verify block and two sequences in one batch, built as for `device`
    and checked against its rules; the MoE logits as the CPU's own graphs compute them."""
    monkeypatch.setenv("DSPARK_CHECK_MUL_MAT_ID", device)
    rules(device)
    _two_sequences(Model(dense["q8_0"]))
    for type_name, path in moe.items():
        got = _decode_and_verify(Model(path))
        rules("cpu")
        want = _decode_and_verify(Model(path))
        rules(device)
        # the CPU's own q8_0 matmuls run the blocks kernel where it has AVX2 or AVX-512 (float steps of
        # their own), CUDA's rules ggml's: the same products then differ by more than rounding
        blocks = type_name == "q8_0" and cpu_isa() in ("avx2", "avx512_vnni", "amx_int8")
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 if blocks else 2e-4, err_msg=type_name)


def test_the_check_names_the_ids_ggml_cuda_would_abort_on(dense, rules, monkeypatch):
    """Vulkan's form of attention in sequence order (all of a token's query heads in one row of a
    mul_mat_id) repeats the ids of shared KV heads: ggml-cuda's sorting path asserts on it."""
    rules("vulkan")
    monkeypatch.setenv("DSPARK_CHECK_MUL_MAT_ID", "cuda")
    with pytest.raises(DSparkError, match="in_order_scores.*repeats within the token's row"):
        _ctx(Model(dense["f32"])).decode(_tokens(6, 5))
    monkeypatch.setenv("DSPARK_CHECK_MUL_MAT_ID", "1")  # by the Vulkan rules it runs under: fine
    _ctx(Model(dense["f32"])).decode(_tokens(6, 5))
