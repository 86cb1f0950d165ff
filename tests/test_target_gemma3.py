"""Gemma-3's keys: what the converter writes for a tiny transformers checkpoint, what the loader
reads when a key is absent (llama.cpp's defaults), and the bad values it refuses with a message.
The arithmetic against transformers is in test_target_gemma4_moe.py (case "gemma3")."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the tiny Gemma-3 checkpoint is made with transformers")
pytest.importorskip("transformers")

import hf_checkpoints as hf  # noqa: E402
from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.convert import convert  # noqa: E402
from dspark_ggml.convert.errors import ConversionError  # noqa: E402
from dspark_ggml.errors import DSparkError  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from new_archs import WINDOW, converted  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402

PATTERN_KEY = "gemma3.attention.sliding_window_pattern"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.getbasetemp() / "new_archs"
    root.mkdir(exist_ok=True)
    return converted(root, "gemma3")


def _logits(path: Path, prompt: list[int]) -> np.ndarray:
    ctx = Context(Model(path), n_ctx=64, type_kv="f32")
    ctx.decode(prompt, outputs=np.ones(len(prompt), bool))
    return ctx.get_logits(copy=True)


def test_converter_writes_llama_cpps_keys(tiny):
    import gguf

    _, path = tiny
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "gemma3"
    # transformers' layout for 7 layers with period 6: the sixth layer is the global one
    assert fields[PATTERN_KEY] == [True] * 5 + [False, True]
    assert fields["gemma3.attention.sliding_window"] == WINDOW
    assert fields["gemma3.rope.freq_base"] == 1e6 and fields["gemma3.rope.freq_base_swa"] == 1e4
    assert fields["gemma3.attention.key_length"] == 32
    names = {t.name for t in r.tensors}
    assert "output.weight" not in names and "blk.0.post_ffw_norm.weight" in names


def test_a_period_pattern_and_absent_keys_take_llama_cpps_defaults(tiny, tmp_path):
    """The period form of the pattern (6: layers 5, 11, ... global) and rope.freq_base_swa absent
    (10000) give the same model as the converter's explicit array."""
    _, path = tiny
    prompt = list(range(5, 5 + 3 * WINDOW))
    want = _logits(path, prompt)
    edited = rewrite_gguf(path, tmp_path / "period.gguf",
                          drop_keys=(PATTERN_KEY, "gemma3.rope.freq_base_swa"))
    # the default period is 6, which makes layer 6 sliding, as the array says
    assert np.array_equal(_logits(edited, prompt), want)
    every = rewrite_gguf(path, tmp_path / "p1.gguf", drop_keys=(PATTERN_KEY,), set_keys={PATTERN_KEY: 1})
    assert not np.allclose(_logits(every, prompt), want, atol=1e-3)  # period 1: every layer global


def test_bad_keys_are_refused_with_a_message(tiny, tmp_path):
    _, path = tiny
    zero = rewrite_gguf(path, tmp_path / "w0.gguf", set_keys={"gemma3.attention.sliding_window": 0})
    with pytest.raises(DSparkError, match="sliding_window .*must be positive"):
        Model(zero)
    long = rewrite_gguf(path, tmp_path / "long.gguf", drop_keys=(PATTERN_KEY,),
                        set_keys={PATTERN_KEY: [True] * 9})
    with pytest.raises(DSparkError, match="sliding_window_pattern has 9 entries for 7 layers"):
        Model(long)
    base = rewrite_gguf(path, tmp_path / "base.gguf", set_keys={"gemma3.rope.freq_base_swa": -1.0})
    with pytest.raises(DSparkError, match="freq_base_swa"):
        Model(base)


def test_converter_refuses_a_query_scale_llama_cpp_would_not_use(tmp_path):
    src = hf.make_gemma3_target(tmp_path / "hf", query_pre_attn_scalar=256)
    with pytest.raises(ConversionError, match="query_pre_attn_scalar"):
        convert(src, tmp_path / "out.gguf", outtype="f32", progress=False)


@pytest.mark.parametrize("type_kv, nbytes", [("f16", 2), ("f32", 4)])
def test_kv_bytes_are_every_layers_k_and_v(tiny, type_kv, nbytes):
    """What the `loaded` line reports: 7 layers, K and V of 2 heads of 32 per cell."""
    _, path = tiny
    ctx = Context(Model(path), n_ctx=256, type_kv=type_kv)
    assert ctx.kv.n_cells == 256
    assert ctx.kv.nbytes == 7 * 2 * (2 * 32) * 256 * nbytes
