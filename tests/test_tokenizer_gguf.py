"""The fast GGUF metadata reader returns what gguf.GGUFReader returns, and fast."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import gguf
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import Tokenizer, TokenizerError, read_gguf_metadata  # noqa: E402


def _write_mixed(path: Path, endian: gguf.GGUFEndian) -> Path:
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    w.add_uint8("t.u8", 200)
    w.add_int16("t.i16", -1234)
    w.add_uint64("t.u64", 2**40 + 3)
    w.add_float64("t.f64", 3.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo 🚀")
    w.add_array("t.strs", ["a", "", "ü b", "中"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("tokenizer.ggml.tokens", ["x", "y"])
    w.add_tensor("dummy", __import__("numpy").zeros((2, 3), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_same_values_as_gguf_reader(tmp_path: Path) -> None:
    path = _write_mixed(tmp_path / "m.gguf", gguf.GGUFEndian.LITTLE)
    fields = gguf.GGUFReader(str(path)).fields
    reference = {k: f.contents() for k, f in fields.items() if not k.startswith("GGUF.")}
    ours = read_gguf_metadata(path)
    assert ours.keys() == reference.keys()
    for key, value in reference.items():
        assert ours[key] == pytest.approx(value) if isinstance(value, float) else ours[key] == value, key
    assert ours["t.strs"] == ["a", "", "ü b", "中"]


def test_big_endian_file_is_refused_by_name(tmp_path: Path) -> None:
    # one reader, the core's: like llama.cpp it reads little-endian files only, and says so
    path = _write_mixed(tmp_path / "be.gguf", gguf.GGUFEndian.BIG)
    with pytest.raises(TokenizerError, match="big-endian"):
        read_gguf_metadata(path)


def test_prefix_filter(tmp_path: Path) -> None:
    path = _write_mixed(tmp_path / "m.gguf", gguf.GGUFEndian.LITTLE)
    assert read_gguf_metadata(path, prefix="tokenizer.") == {"tokenizer.ggml.tokens": ["x", "y"]}


def _synthetic_150k(path: Path) -> Path:
    """A consistent byte-level BPE vocabulary of ~150k tokens: 256 bytes, 2- and 3-character merges."""
    rng = random.Random(0)
    alphabet = fx.pre_tokenizers.ByteLevel.alphabet()
    alphabet.sort()
    tokens, merges = list(alphabet), []
    pairs = rng.sample([(a, b) for a in alphabet for b in alphabet], 60_000)
    for a, b in pairs:
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    for a, b in rng.sample(pairs, 30_000):
        for c in rng.sample(alphabet, 3):
            tokens.append(a + b + c)
            merges.append(f"{a}{b} {c}")
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    return fx.write_gguf(path, "qwen2", {"model": "gpt2", "pre": "qwen2", "tokens": tokens, "types": types,
                                         "merges": merges, "eos_id": len(tokens) - 1})


def test_150k_vocabulary_loads_quickly(tmp_path: Path) -> None:
    path = _synthetic_150k(tmp_path / "big.gguf")
    start = time.perf_counter()
    meta = read_gguf_metadata(path, prefix="tokenizer.")
    read_s = time.perf_counter() - start
    tok = Tokenizer.from_metadata(meta)
    total_s = time.perf_counter() - start
    assert tok.n_vocab > 150_000
    assert tok.eog_ids == {tok.n_vocab - 1, tok.n_vocab - 3}  # eos, and <|endoftext|> by its text
    text = "The quick brown fox 🦊 jumps 12345 times.\n" * 10
    assert tok.decode(tok.encode(text)) == text
    # Generous bounds for a loaded 2-core machine; gguf.GGUFReader alone takes ~15 s on such a file.
    assert read_s < 4.0, read_s
    assert total_s < 12.0, total_s
