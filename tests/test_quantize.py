"""`dspark-ggml quantize` (python/dspark_ggml/quantize.py): llama-quantize's types on tiny models.

The expected type tables below are written out by hand from llama.cpp's rules in
src/llama-quant.cpp (not from running the quantizer); the rules they exercise are named next to
them. The outputs are read back through the C core (types, metadata), dequantized with the gguf
package's own numpy dequantizers (independent of ggml's) and loaded by the runtime.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import dspark_ggml.quantize as qz
from dspark_ggml import Context, Model
from dspark_ggml.cli import main
from dspark_ggml.errors import FileAccessError, FileFormatError, InvalidArgumentError, UnsupportedError
from dspark_ggml.gguf_file import GGUFFile
from tests.tiny_models import read_gguf_weights

PROMPT = [5, 17, 42, 99, 123, 7]


# ---- models --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_src(make_target):
    """2 layers, every row 256 wide (K-quant blocks fit everywhere), untied head."""
    return make_target("quantize_plain", arch="llama", n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                       n_ff=256, n_layer=2)


@pytest.fixture(scope="module")
def mix_src(make_target):
    """8 layers (so the "more bits" layers are 0, 3, 6, 7), GQA 4 (n_head 4 / n_head_kv 1), untied."""
    return make_target("quantize_mix", arch="llama", n_embd=256, n_head=4, n_head_kv=1, head_dim=64,
                       n_ff=256, n_layer=8)


@pytest.fixture(scope="module")
def odd_src(make_target):
    """Rows of 64 (token_embd, q/k/v, gate/up: a multiple of 32, not of 256), 96 (ffn_down) and
    48 (attn_output: not even a multiple of 32); tied embeddings, 2 layers."""
    return make_target("quantize_odd", arch="llama", n_embd=64, n_head=4, n_head_kv=2, head_dim=12,
                       n_ff=96, n_layer=2, tied_embeddings=True)


@pytest.fixture(scope="module")
def q8_src(make_target):
    return make_target("quantize_q8", arch="llama", n_embd=64, n_layer=1, dtype="q8_0")


def types_of(path: Path) -> dict[str, str]:
    with GGUFFile(path) as f:
        return {t.name: t.type for t in f.tensors()}


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def logits_of(path: Path) -> np.ndarray:
    model = Model(path)
    ctx = Context(model, n_ctx=32, n_threads=1, type_kv="f32")
    ctx.decode(PROMPT, outputs=[True] * len(PROMPT))
    return ctx.get_logits(copy=True)


LAYER_PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
NORMS = ("attn_norm", "ffn_norm")


def table(n_layer: int, *, base: str, token_embd: str | None = None, output: str | None = None,
          **per_part: object) -> dict[str, str]:
    """Expected types: every layer matrix `base` unless `per_part[part]` gives one type or a list
    by layer; norms f32."""
    out = {"token_embd.weight": token_embd or base, "output_norm.weight": "f32"}
    if output is not None:
        out["output.weight"] = output
    for i in range(n_layer):
        for part in LAYER_PARTS:
            t = per_part.get(part, base)
            out[f"blk.{i}.{part}.weight"] = t[i] if isinstance(t, list) else t  # type: ignore[index]
        for norm in NORMS:
            out[f"blk.{i}.{norm}.weight"] = "f32"
    return out


# ---- plain types: every matrix in the type (--pure); loads, runs, dequantizes close --------------

# bound on the relative RMS error of each weight after the round trip (measured: 0.45-0.75x these);
# the logits' relative error must stay within 4x it
PLAIN_TYPES = {
    "f32": 0.0, "f16": 5e-4, "bf16": 3e-3, "q8_0": 6e-3, "q6_K": 0.02, "q5_1": 0.045, "q5_0": 0.045,
    "q5_K": 0.04, "q4_1": 0.09, "q4_0": 0.09, "q4_K": 0.08, "iq4_nl": 0.09, "iq4_xs": 0.09,
    "q3_K": 0.18, "q2_K": 0.33,
}


@pytest.fixture(scope="module")
def plain_logits(plain_src):
    return logits_of(plain_src[0])


@pytest.mark.parametrize("type_name", list(PLAIN_TYPES))
def test_plain_type_loads_runs_and_dequantizes_close(type_name, plain_src, plain_logits, tmp_path):
    src, weights, _ = plain_src
    out = tmp_path / f"{type_name}.gguf"
    summary = qz.quantize_gguf(src, out, type_name.upper() if type_name == "q4_K" else type_name, pure=True,
                               n_threads=2, progress=False)
    assert summary.n_fallback == 0
    types = types_of(out)
    for name, t in types.items():
        assert t == ("f32" if name.endswith("norm.weight") else type_name), name
    back = read_gguf_weights(out)
    assert set(back) == set(weights)
    for name, w in weights.items():
        err = np.linalg.norm(back[name] - w) / np.linalg.norm(w)
        assert err <= PLAIN_TYPES[type_name], (name, err)
        if type_name != "f32":
            assert name.endswith("norm.weight") or err > 0, name  # really converted
    logits = logits_of(out)
    assert np.isfinite(logits).all()
    rel = np.linalg.norm(logits - plain_logits) / np.linalg.norm(plain_logits)
    assert rel <= 4 * PLAIN_TYPES[type_name] + 1e-5, rel


def test_threads_do_not_change_the_bytes(plain_src, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    qz.quantize_gguf(plain_src[0], a, "Q4_K_M", n_threads=1, progress=False)
    qz.quantize_gguf(plain_src[0], b, "Q4_K_M", n_threads=2, progress=False)
    assert a.read_bytes() == b.read_bytes()


def test_metadata_is_copied_and_file_type_set(plain_src, tmp_path):
    src = plain_src[0]
    out = tmp_path / "m.gguf"
    qz.quantize_gguf(src, out, "q4_k_m", progress=False)
    with GGUFFile(src) as a, GGUFFile(out) as b:
        ma, mb = a.metadata, b.metadata
        assert a.file_size > 0 and b.version == 3
    assert mb["general.file_type"] == 15            # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert mb["general.quantization_version"] == 2  # GGML_QNT_VERSION
    assert list(ma) == list(mb)                     # same keys, same order (replaced in place)
    for key in ma:
        if key in ("general.file_type", "general.quantization_version"):
            continue
        va, vb = ma[key], mb[key]
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype and np.array_equal(va, vb), key
        else:
            assert va == vb, key
    assert len(mb["tokenizer.ggml.tokens"]) == 320 and mb["tokenizer.chat_template"]


# ---- mixtures on the 8-layer model ---------------------------------------------------------------
# use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2 -> layers 0, 3, 6, 7 of 8.
# GQA = 4. Untied: output.weight gets Q6_K (Q8_0 stays Q8_0), token_embd the base type.

K4, K5, K6, K3 = "q4_K", "q5_K", "q6_K", "q3_K"
MIXTURES_8 = {
    # attn_v and ffn_down: Q6_K on the more-bits layers
    "Q4_K_M": table(8, base=K4, output=K6, attn_v=[K6, K4, K4, K6, K4, K4, K6, K6],
                    ffn_down=[K6, K4, K4, K6, K4, K4, K6, K6]),
    "Q5_K_M": table(8, base=K5, output=K6, attn_v=[K6, K5, K5, K6, K5, K5, K6, K6],
                    ffn_down=[K6, K5, K5, K6, K5, K5, K6, K6]),
    "Q6_K": table(8, base=K6, output=K6),
    # attn_v: Q5_K for the first 4 attn_v tensors; ffn_down: Q5_K below layer n/8 = 1
    "Q4_K_S": table(8, base=K4, output=K6, attn_v=[K5] * 4 + [K4] * 4, ffn_down=[K5] + [K4] * 7),
    "Q5_K_S": table(8, base=K5, output=K6),
    # attn_v: Q5_K for the first 2, then Q4_K; ffn_down Q4_K (no layer below n/16 = 0); attn_output Q4_K
    "Q3_K_M": table(8, base=K3, output=K6, attn_v=[K5] * 2 + [K4] * 6, ffn_down=K4, attn_output=K4),
    "Q3_K_L": table(8, base=K3, output=K6, attn_v=K5, ffn_down=K5, attn_output=K5),
    "Q3_K_S": table(8, base=K3, output=K6),
    # attn_v Q4_K (GQA >= 4), ffn_down and attn_output Q3_K
    "Q2_K": table(8, base="q2_K", output=K6, attn_v=K4, ffn_down=K3, attn_output=K3),
    # attn_v Q5_K (GQA >= 4); ffn_down Q5_K below layer n/8 = 1
    "IQ4_XS": table(8, base="iq4_xs", output=K6, attn_v=K5, ffn_down=[K5] + ["iq4_xs"] * 7),
    "IQ4_NL": table(8, base="iq4_nl", output=K6, attn_v=K5, ffn_down=[K5] + ["iq4_nl"] * 7),
    "Q4_0": table(8, base="q4_0", output=K6),
    "Q5_1": table(8, base="q5_1", output=K6),
    "Q8_0": table(8, base="q8_0", output="q8_0"),
    "F16": table(8, base="f16", output="f16"),
    "BF16": table(8, base="bf16", output="bf16"),
}


@pytest.mark.parametrize("type_name", ["Q4_K_M", "Q5_K_M", "Q6_K"])
def test_mixture_writes_llama_quantize_types(type_name, mix_src, tmp_path):
    out = tmp_path / f"{type_name}.gguf"
    qz.quantize_gguf(mix_src[0], out, type_name, progress=False)
    assert types_of(out) == MIXTURES_8[type_name]
    logits = logits_of(out)
    assert np.isfinite(logits).all()


@pytest.mark.parametrize("type_name", sorted(MIXTURES_8))
def test_mixture_plan(type_name, mix_src):
    assert qz.plan_quantization(mix_src[0], type_name).types == MIXTURES_8[type_name]


def test_aliases_and_numbers_name_the_mixtures(mix_src):
    plan = qz.plan_quantization(mix_src[0], "q4_k").types
    assert plan == MIXTURES_8["Q4_K_M"]
    assert qz.resolve_file_type("Q5_K").name == "Q5_K_M" and qz.resolve_file_type("q3_k").name == "Q3_K_M"
    assert qz.resolve_file_type("15").name == "Q4_K_M" and qz.resolve_file_type("7").name == "Q8_0"


def test_pure_gives_every_matrix_the_base_type(mix_src, tmp_path):
    out = tmp_path / "pure.gguf"
    s = qz.quantize_gguf(mix_src[0], out, "Q4_K_M", pure=True, progress=False)
    assert types_of(out) == table(8, base=K4, output=K4)
    with GGUFFile(out) as f:
        assert f.get("general.file_type") == 15
    assert s.n_fallback == 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_qwen_archs_follow_the_same_rules(arch, make_target):
    # 2 layers: use_more_bits(0, 2) is false, use_more_bits(1, 2) true (1 >= 7*2/8 = 1)
    src, _, _ = make_target(f"quantize_{arch}", arch=arch, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                            n_ff=256, n_layer=2)
    types = qz.plan_quantization(src, "Q4_K_M").types
    expected = table(2, base=K4, output=K6, attn_v=[K4, K6], ffn_down=[K4, K6])
    for name, t in types.items():
        if name.endswith(".bias") or name.endswith("_norm.weight"):
            assert t == "f32", name  # qwen2 biases, qwen3 q/k norms: 1-D, kept
        else:
            assert t == expected[name], name


# ---- fallbacks for rows that do not split into blocks --------------------------------------------
# K-quant rows need multiples of 256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0,
# IQ4_XS -> IQ4_NL; a row that is no multiple of 32 either (attn_output, 48) -> F16.
# Tied embeddings: token_embd gets the output rule, Q8_0 because 64 is no multiple of 256.
# 2 layers: the more-bits layer is 1.

ODD = {
    "Q4_K_M": table(2, base="q5_0", token_embd="q8_0", attn_v=["q5_0", "q8_0"], ffn_down=["q5_0", "q8_0"],
                    attn_output="f16"),
    "Q5_K_M": table(2, base="q5_1", token_embd="q8_0", attn_v=["q5_1", "q8_0"], ffn_down=["q5_1", "q8_0"],
                    attn_output="f16"),
    "Q6_K": table(2, base="q8_0", token_embd="q8_0", attn_output="f16"),
    "IQ4_XS": table(2, base="iq4_nl", token_embd="q8_0", attn_output="f16"),
    # attn_v: Q3_K (GQA 2 < 4) -> Q4_0; ffn_down, attn_output: Q3_K -> Q4_0 (-> F16 for attn_output)
    "Q2_K": table(2, base="q4_0", token_embd="q8_0", attn_output="f16"),
    # Q4_0's blocks of 32 fit 64 and 96; token_embd: 64 is a multiple of 32, so Q6_K -> Q8_0 fallback
    "Q4_0": table(2, base="q4_0", token_embd="q8_0", attn_output="f16"),
}


@pytest.mark.parametrize("type_name", ["Q4_K_M", "Q6_K", "IQ4_XS"])
def test_fallback_types_written(type_name, odd_src, tmp_path):
    src, weights, _ = odd_src
    out = tmp_path / f"odd-{type_name}.gguf"
    s = qz.quantize_gguf(src, out, type_name, progress=False)
    assert types_of(out) == ODD[type_name]
    assert s.n_fallback > 0
    back = read_gguf_weights(out)
    for name, w in weights.items():
        assert np.linalg.norm(back[name] - w) <= 0.12 * np.linalg.norm(w), name


@pytest.mark.parametrize("type_name", ["Q5_K_M", "Q2_K", "Q4_0"])
def test_fallback_plan(type_name, odd_src):
    assert qz.plan_quantization(odd_src[0], type_name).types == ODD[type_name]


def test_pure_keeps_only_the_unavoidable_fallbacks(odd_src):
    types = qz.plan_quantization(odd_src[0], "Q4_K_M", pure=True).types
    assert types == table(2, base="q5_0", token_embd="q5_0", attn_output="f16")


# ---- errors: the right exception, nothing left behind --------------------------------------------

def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model\n" * 10)
    with pytest.raises(FileFormatError, match="not a GGUF"):
        qz.quantize_gguf(bad, tmp_path / "out.gguf", "q8_0", progress=False)
    assert files_in(tmp_path) == {"bad.gguf"}


def test_truncated_input(plain_src, tmp_path):
    data = Path(plain_src[0]).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(FileFormatError, match="truncated"):
        qz.quantize_gguf(cut, tmp_path / "out.gguf", "q8_0", progress=False)
    assert files_in(tmp_path) == {"cut.gguf"}


def test_missing_input(tmp_path):
    with pytest.raises(FileAccessError):
        qz.quantize_gguf(tmp_path / "none.gguf", tmp_path / "out.gguf", "q8_0", progress=False)
    assert files_in(tmp_path) == set()


def test_unknown_type_lists_the_valid_ones(plain_src, tmp_path):
    with pytest.raises(InvalidArgumentError) as e:
        qz.quantize_gguf(plain_src[0], tmp_path / "out.gguf", "q9_k", progress=False)
    for name in ("Q4_K_M", "Q6_K", "IQ4_NL", "Q8_0", "BF16"):
        assert name in str(e.value)
    assert files_in(tmp_path) == set()


@pytest.mark.parametrize("type_name, why", [("iq2_xxs", "importance matrix"), ("Q2_K_S", "importance matrix"),
                                            ("iq3_s", "not exposed")])
def test_types_that_cannot_be_made_here(type_name, why, plain_src, tmp_path):
    with pytest.raises(UnsupportedError, match=why):
        qz.quantize_gguf(plain_src[0], tmp_path / "out.gguf", type_name, progress=False)
    assert files_in(tmp_path) == set()


def test_output_folder_missing(plain_src, tmp_path):
    with pytest.raises(FileAccessError, match="does not exist"):
        qz.quantize_gguf(plain_src[0], tmp_path / "nope" / "out.gguf", "q8_0", progress=False)
    assert files_in(tmp_path) == set()


def test_output_is_the_input(plain_src, tmp_path):
    src = tmp_path / "model.gguf"
    shutil.copyfile(plain_src[0], src)
    before = src.read_bytes()
    (tmp_path / "sub").mkdir()
    for dst in (src, tmp_path / "sub" / ".." / "model.gguf"):
        with pytest.raises(InvalidArgumentError, match="is the input"):
            qz.quantize_gguf(src, dst, "q8_0", progress=False)
    assert src.read_bytes() == before and files_in(tmp_path) == {"model.gguf", "sub"}


def test_requantizing_needs_the_flag(q8_src, tmp_path):
    src = q8_src[0]
    out = tmp_path / "q4.gguf"
    with pytest.raises(InvalidArgumentError, match="--allow-requantize") as e:
        qz.quantize_gguf(src, out, "q4_0", progress=False)
    assert "quality" in str(e.value) and "q8_0" in str(e.value)
    assert files_in(tmp_path) == set()
    qz.quantize_gguf(src, out, "q4_0", allow_requantize=True, progress=False)
    assert types_of(out)["blk.0.attn_q.weight"] == "q4_0"
    # nothing is requantized when the types stay the same (only norms and q8_0 matrices)
    same = tmp_path / "same.gguf"
    s = qz.quantize_gguf(src, same, "q8_0", progress=False)
    assert s.n_converted == 0 and types_of(same) == types_of(src)


def test_full_disk_leaves_nothing(plain_src, tmp_path, monkeypatch):
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"the old file")
    real_write, state = qz._write, {"n": 0}

    def write(f, data):
        state["n"] += memoryview(data).nbytes
        if state["n"] > 200_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(f, data)

    monkeypatch.setattr(qz, "_write", write)
    with pytest.raises(FileAccessError, match="no space left") as e:
        qz.quantize_gguf(plain_src[0], dst, "q8_0", n_threads=2, progress=False)
    assert str(dst) in str(e.value)
    assert isinstance(e.value, OSError)
    assert files_in(tmp_path) == {"out.gguf"} and dst.read_bytes() == b"the old file"


@pytest.mark.parametrize("n_threads", [1, 2])
def test_ctrl_c_leaves_nothing(n_threads, plain_src, tmp_path, monkeypatch):
    real, calls = qz._convert_rows, {"n": 0}

    def convert(*args):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(qz, "_convert_rows", convert)
    with pytest.raises(KeyboardInterrupt):
        qz.quantize_gguf(plain_src[0], tmp_path / "out.gguf", "q4_0", n_threads=n_threads, progress=False)
    assert files_in(tmp_path) == set()


# ---- the command ---------------------------------------------------------------------------------

def test_cli_writes_and_reports(plain_src, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main(["quantize", str(plain_src[0]), str(out), "Q8_0", "-t", "2", "-q"]) == 0
    assert "Q8_0" in capsys.readouterr().out
    assert types_of(out)["blk.1.ffn_down.weight"] == "q8_0"


@pytest.mark.parametrize("type_name, flags, message", [
    ("bogus", [], "unknown quantize type 'bogus'"),
    ("iq2_xxs", [], "importance matrix"),
])
def test_cli_errors_are_one_line(type_name, flags, message, plain_src, tmp_path, capsys):
    out = tmp_path / "x.gguf"
    assert main(["quantize", str(plain_src[0]), str(out), type_name, "-q", *flags]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dspark-ggml quantize: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_cli_requantize_error_names_the_flag(q8_src, tmp_path, capsys):
    out = tmp_path / "x.gguf"
    assert main(["quantize", str(q8_src[0]), str(out), "q4_k_m", "-q"]) == 1
    assert "--allow-requantize" in capsys.readouterr().err
    assert main(["quantize", str(q8_src[0]), str(out), "q4_k_m", "-q", "--allow-requantize"]) == 0
    assert os.path.getsize(out) > 0
