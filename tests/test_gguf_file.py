"""GGUF reading through the C core, and every kind of bad file raising a clear Python error."""
from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from dspark_ggml.errors import FileAccessError, FileFormatError, InvalidArgumentError, UnsupportedError
from dspark_ggml.gguf_file import GGUFFile
from dspark_ggml.model import Model


@pytest.fixture(scope="module")
def good(make_target):
    return make_target("gguf_good")


def test_metadata_and_tensor_table_match_the_gguf_package(good):
    path, _, cfg = good
    reader = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.architecture == "qwen3"
        assert f.get("qwen3.block_count") == cfg.n_layer
        assert f.get("qwen3.attention.layer_norm_rms_epsilon") == pytest.approx(cfg.rms_eps)
        tensors = {t.name: t for t in f.tensors()}
        assert len(tensors) == len(reader.tensors)
        for rt in reader.tensors:
            t = tensors[rt.name]
            assert t.shape == tuple(int(x) for x in rt.shape)  # both in ggml order
            assert t.type == rt.tensor_type.name.lower()
            assert t.offset == rt.data_offset
            assert t.nbytes == rt.n_bytes
        tokens = f.get("tokenizer.ggml.tokens")
        assert tokens == [str(bytes(p), "utf-8") for p in
                          (reader.fields["tokenizer.ggml.tokens"].parts[i]
                           for i in reader.fields["tokenizer.ggml.tokens"].data)]
        types = f.get("tokenizer.ggml.token_type")
        assert isinstance(types, np.ndarray) and len(types) == len(tokens)


def _write(path: Path, arch: str = "qwen3", tensors: dict | None = None, kv: dict | None = None) -> Path:
    w = gguf.GGUFWriter(path, arch)
    for k, v in (kv or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_single_lookups_read_one_entry(good):
    """get() and tensor() ask the core for one entry (dspark_gguf_find_key / _find_tensor) instead of
    reading every value, a tokenizer's vocabulary among them."""
    path, _, cfg = good
    with GGUFFile(path) as f:
        assert f.architecture == "qwen3" and f._metadata is None
        assert f.get("qwen3.block_count") == cfg.n_layer
        assert f.get("no.such.key", 7) == 7 and "no.such.key" not in f and "general.architecture" in f
        assert f._metadata is None
        emb = f.tensor("token_embd.weight")
        assert emb == next(t for t in f.tensors() if t.name == "token_embd.weight")
        assert f.tensor("no.such.tensor") is None
        assert f.get("qwen3.block_count") == f.metadata["qwen3.block_count"]


def test_missing_file(tmp_path):
    with pytest.raises(FileAccessError, match="missing.gguf"):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(FileAccessError, match="missing.gguf"):
        Model(tmp_path / "missing.gguf")


def test_directory_is_refused(tmp_path):
    with pytest.raises(FileAccessError, match="not a regular file"):
        Model(tmp_path)


@pytest.mark.parametrize("content", [b"", b"GG", b"PK\x03\x04 a zip file, not gguf" * 10, b"\x89PNG\r\n\x1a\n" + bytes(64)])
def test_foreign_or_empty_file(tmp_path, content):
    p = tmp_path / "foreign.gguf"
    p.write_bytes(content)
    with pytest.raises(FileFormatError, match="foreign.gguf"):
        Model(p)


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file(tmp_path, good, fraction):
    path = good[0]
    data = path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: max(4, int(len(data) * fraction))])
    with pytest.raises(FileFormatError, match="cut.gguf.*(truncated|invalid)"):
        Model(p)


def test_garbage_after_header_is_refused(tmp_path, good):
    data = bytearray(good[0].read_bytes())
    data[8:24] = b"\xff" * 16  # tensor and key counts become absurd
    p = tmp_path / "garbled.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(FileFormatError, match="garbled.gguf"):
        Model(p)


def test_unknown_architecture(tmp_path):
    p = _write(tmp_path / "gpt2.gguf", arch="gpt2", tensors={"token_embd.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(UnsupportedError, match="gpt2.gguf.*unknown architecture 'gpt2'"):
        Model(p)


def test_draft_loaded_as_target(tmp_path):
    p = _write(tmp_path / "draft.gguf", arch="dflash")
    with pytest.raises(InvalidArgumentError, match="draft"):
        Model(p)


def _copy_without(src: Path, dst: Path, drop_key: str | None = None, drop_tensor: str | None = None,
                  reshape: tuple[str, tuple[int, ...]] | None = None, retype: tuple[str, str] | None = None) -> Path:
    """Rewrite a GGUF with one key or tensor removed or altered."""
    r = gguf.GGUFReader(src)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        value = field.contents()
        vtype = field.types[0]
        if retype and name == retype[0]:
            w.add_string(name, retype[1])
            continue
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, vtype)
    for t in r.tensors:
        if t.name == drop_tensor:
            continue
        data = np.array(t.data)
        if reshape and t.name == reshape[0]:
            data = np.zeros(reshape[1], dtype=np.float32)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if not reshape or t.name != reshape[0] else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_missing_required_key(tmp_path, good):
    p = _copy_without(good[0], tmp_path / "nokey.gguf", drop_key="qwen3.attention.layer_norm_rms_epsilon")
    with pytest.raises(FileFormatError, match="nokey.gguf.*missing required key 'qwen3.attention.layer_norm_rms_epsilon'"):
        Model(p)


def test_key_of_wrong_type(tmp_path, good):
    p = _copy_without(good[0], tmp_path / "badtype.gguf", retype=("qwen3.block_count", "two"))
    with pytest.raises(FileFormatError, match="badtype.gguf.*'qwen3.block_count' should be an integer"):
        Model(p)


def test_missing_tensor(tmp_path, good):
    p = _copy_without(good[0], tmp_path / "notensor.gguf", drop_tensor="blk.1.ffn_down.weight")
    with pytest.raises(FileFormatError, match="notensor.gguf.*missing required tensor 'blk.1.ffn_down.weight'"):
        Model(p)


def test_tensor_of_wrong_shape(tmp_path, good):
    p = _copy_without(good[0], tmp_path / "shape.gguf", reshape=("blk.0.attn_q.weight", (32, 64)))
    with pytest.raises(FileFormatError, match=r"shape.gguf.*'blk.0.attn_q.weight' has shape \[64, 32\], expected \[64, 64\]"):
        Model(p)


def test_good_file_still_loads_after_failures(good, tmp_path):
    shutil.copy(good[0], tmp_path / "ok.gguf")
    with Model(tmp_path / "ok.gguf") as m:
        assert m.arch == "qwen3" and m.n_layer == good[2].n_layer
