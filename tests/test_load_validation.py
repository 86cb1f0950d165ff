"""Files that pass the GGUF reader but would abort inside ggml later (a bad tensor type, epsilon or
alignment) are refused at load time with an error naming the tensor, key or value; so are context
options ggml would abort on (a KV type that splits heads, more threads than its pool); and the
quantization helpers refuse what would read out of bounds or call through a null pointer."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import FileFormatError, InvalidArgumentError, UnsupportedError
from dspark_ggml.model import Model
from dspark_ggml.quant import dequantize, quantize
from dspark_ggml.sampling import SamplingParams
from tests.tiny_models import DraftConfig, TargetConfig, write_draft
from tests.gguf_edit import rewrite_gguf

QT = gguf.GGMLQuantizationType
PROMPT = [5, 9, 33, 100, 7]


@pytest.fixture(scope="module")
def good(make_target):
    return make_target("validation_good")


@pytest.fixture(scope="module")
def draft(good, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("validation") / "draft.gguf"
    write_draft(path, DraftConfig(block_size=4), good[2], seed=1)
    return path


def _greedy(path: Path, **model_kw) -> list[int]:
    with Model(path, **model_kw) as m:
        return Engine(Context(m, n_ctx=64, n_threads=1)).generate(PROMPT, SamplingParams(max_tokens=6))


def _q8_0(values: np.ndarray) -> tuple[np.ndarray, QT]:
    return quantize(values.reshape(1, -1), "q8_0").reshape(-1), QT.Q8_0


# ---- tensor types -------------------------------------------------------------------------------

E = TargetConfig().n_embd


@pytest.mark.parametrize("name,value,type_name", [
    ("blk.0.attn_norm.weight", np.ones(E, np.float16), "f16"),
    ("output_norm.weight", np.ones(E, np.int32), "i32"),
    ("blk.1.ffn_norm.weight", _q8_0(np.ones(E, np.float32)), "q8_0"),
    ("blk.0.attn_q_norm.weight", np.ones(16, np.float16), "f16"),
])
@pytest.mark.parametrize("use_mmap", [True, False])
def test_non_f32_vector_is_refused_naming_tensor_and_type(tmp_path, good, name, value, type_name, use_mmap):
    p = rewrite_gguf(good[0], tmp_path / "vec.gguf", tensors={name: value})
    with pytest.raises(FileFormatError, match=rf"vec.gguf.*tensor '{name}' has type {type_name}, expected f32"):
        Model(p, use_mmap=use_mmap)


def test_integer_weight_matrix_is_refused(tmp_path, good):
    shape = (good[1]["blk.0.ffn_up.weight"].shape)
    p = rewrite_gguf(good[0], tmp_path / "mat.gguf", tensors={"blk.0.ffn_up.weight": np.ones(shape, np.int32)})
    with pytest.raises(FileFormatError, match=r"mat.gguf.*'blk.0.ffn_up.weight' has type i32, expected f32, f16, bf16"):
        Model(p)


def test_f16_weight_matrix_still_loads(tmp_path, good):
    w = good[1]["blk.0.ffn_up.weight"].astype(np.float16)
    p = rewrite_gguf(good[0], tmp_path / "f16mat.gguf", tensors={"blk.0.ffn_up.weight": w})
    assert len(_greedy(p)) == 6


@pytest.mark.parametrize("name", ["enc.output_norm.weight", "blk.0.attn_norm.weight"])
def test_draft_vector_of_quantized_type_is_refused(tmp_path, good, draft, name):
    p = rewrite_gguf(draft, tmp_path / "dvec.gguf", tensors={name: _q8_0(np.ones(E, np.float32))})
    with Model(good[0]) as t:
        with pytest.raises(FileFormatError, match=rf"dvec.gguf.*tensor '{name}' has type q8_0, expected f32"):
            DraftModel(p, t)


# ---- epsilon --------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [-1e-6, math.nan, math.inf])
def test_bad_rms_epsilon_is_refused_at_load(tmp_path, good, draft, eps):
    key = "qwen3.attention.layer_norm_rms_epsilon"
    p = rewrite_gguf(good[0], tmp_path / "eps.gguf", set_keys={key: eps})
    with pytest.raises(FileFormatError, match=rf"eps.gguf.*'{key}' = .*must be a finite number >= 0"):
        Model(p)
    d = rewrite_gguf(draft, tmp_path / "deps.gguf", set_keys={"dflash.attention.layer_norm_rms_epsilon": eps})
    with Model(good[0]) as t:
        with pytest.raises(FileFormatError, match=r"deps.gguf.*'dflash.attention.layer_norm_rms_epsilon'"):
            DraftModel(d, t)


def test_zero_epsilon_is_allowed(tmp_path, good):
    p = rewrite_gguf(good[0], tmp_path / "eps0.gguf", set_keys={"qwen3.attention.layer_norm_rms_epsilon": 0.0})
    assert len(_greedy(p)) == 6


def test_huge_dimension_does_not_wrap(tmp_path, good):
    rewrite_gguf(good[0], tmp_path / "huge.gguf", set_keys={"qwen3.attention.head_count": (1 << 32) + 4})  # 4 after a wrap
    with pytest.raises(FileFormatError, match=r"huge.gguf.*'qwen3.attention.head_count' = 4294967300 is out of range"):
        Model(tmp_path / "huge.gguf")


# ---- alignment ------------------------------------------------------------------------------------

def _misaligned_copy(src: Path, dst: Path, alignment: int) -> Path:
    """A copy with general.alignment = `alignment` whose data section starts off a 32-byte boundary
    (a filler key moves it)."""
    for n in range(64):
        rewrite_gguf(src, dst, set_keys={"test.filler": "x" * (n + 1)}, alignment=alignment)
        if gguf.GGUFReader(dst).data_offset % 32 != 0:
            return dst
    raise AssertionError("no filler length misaligns the data section")


@pytest.mark.parametrize("alignment", [1, 8, 16])
def test_small_alignment_is_refused_with_mmap_and_loads_without(tmp_path, good, alignment):
    p = _misaligned_copy(good[0], tmp_path / "align.gguf", alignment)
    with pytest.raises(FileFormatError, match=rf"align.gguf.*general.alignment {alignment}.*use_mmap off"):
        Model(p)
    assert _greedy(p, use_mmap=False) == _greedy(good[0])


@pytest.mark.parametrize("use_mmap", [True, False])
def test_alignment_not_a_power_of_two_is_refused(tmp_path, good, use_mmap):
    p = rewrite_gguf(good[0], tmp_path / "np2.gguf", set_keys={"general.alignment": 24})
    with pytest.raises(FileFormatError, match=r"np2.gguf.*alignment 24 is not a power of 2"):
        Model(p, use_mmap=use_mmap)


@pytest.mark.parametrize("use_mmap", [True, False])
def test_alignment_that_does_not_fit_the_offsets_is_refused(tmp_path, good, use_mmap):
    p = rewrite_gguf(good[0], tmp_path / "a4k.gguf", set_keys={"general.alignment": 4096})  # data padded to 32
    with pytest.raises(FileFormatError, match=r"a4k.gguf.*(has offset \d+, expected \d+|truncated)"):
        Model(p, use_mmap=use_mmap)


# ---- (de)quantization -------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name", ["i8", "i16", "i32", "i64", "f64"])
def test_dequantize_of_a_type_without_float_conversion_is_refused(type_name):
    with pytest.raises(UnsupportedError, match=rf"dequantizing {type_name} is not supported"):
        dequantize(np.zeros(64, np.uint8), type_name, (8,))


def test_dequantize_refuses_a_short_source_buffer():
    with pytest.raises(InvalidArgumentError, match=r"1048576 q8_0 values need 1114112 bytes, the source has 4"):
        dequantize(np.zeros(4, np.uint8), "q8_0", (1, 2**20))
    with pytest.raises(InvalidArgumentError, match="negative"):
        dequantize(np.zeros(64, np.uint8), "f32", (-2, -8))


def test_dequantize_of_an_exact_buffer_matches_the_values():
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    q = quantize(x, "q8_0")
    assert q.nbytes == 2 * 34
    y = dequantize(q, "q8_0", (2, 32))
    scale = np.abs(x).max(axis=1, keepdims=True) / 127  # q8_0: one scale per 32 values
    assert np.all(np.abs(y - x) <= scale * 0.5 + 1e-3)
    f16 = np.arange(8, dtype=np.float16)
    assert np.array_equal(dequantize(f16.view(np.uint8), "f16", (8,)), f16.astype(np.float32))


# ---- context options ggml would abort on -----------------------------------------------------------

def test_quantized_kv_cache_needs_whole_blocks_per_head(tmp_path):
    from tests.tiny_models import write_target

    cfg = TargetConfig(n_head=6, n_head_kv=3, head_dim=16, n_embd=96)  # K rows of 48: heads of 16 values
    write_target(tmp_path / "h16.gguf", cfg, seed=1)
    with Model(tmp_path / "h16.gguf") as m:
        with pytest.raises(InvalidArgumentError, match=r"KV cache type q8_0 .* head_dim \(16\) is not a multiple"):
            Context(m, n_ctx=64, type_kv="q8_0")
        assert len(Engine(Context(m, n_ctx=64, type_kv="f16", n_threads=1)).generate(PROMPT, SamplingParams(max_tokens=3))) == 3


def test_thread_counts_beyond_ggmls_pool_are_refused(good):
    with Model(good[0]) as m:
        with pytest.raises(InvalidArgumentError, match="n_threads = 100000 exceeds the maximum of 512"):
            Context(m, n_ctx=64, n_threads=100000)
        ctx = Context(m, n_ctx=64, n_threads=1)
        with pytest.raises(InvalidArgumentError, match="n_threads in 1 .. 512"):
            ctx.set_threads(513)
        assert len(Engine(ctx).generate(PROMPT, SamplingParams(max_tokens=3))) == 3


def test_a_draft_freed_after_its_target_does_not_read_it(good, draft):
    """Garbage collection frees the objects of a cycle in any order: freeing a draft whose target is
    already gone must not touch the target (ASan, in CI, sees a read of the freed target)."""
    target = Model(good[0])
    d = DraftModel(draft, target)
    dctx = DraftContext(d, n_ctx=64)
    ctx = Context(target, n_ctx=64)
    target.close()
    ctx.close()
    d.close()
    dctx.close()
    assert d._handle is None and target._handle is None
