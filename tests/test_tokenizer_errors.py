"""Unusable metadata and bad input raise TokenizerError with a message naming the problem."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import Tokenizer, TokenizerError  # noqa: E402

K = "tokenizer.ggml."


def _gpt2_meta(**overrides: Any) -> dict[str, Any]:
    fields = fx.byte_level_gguf_fields(fx.gpt2_like())
    meta: dict[str, Any] = {K + "model": "gpt2", K + "pre": "gpt-2", K + "tokens": fields["tokens"],
                            K + "token_type": fields["types"], K + "merges": fields["merges"]}
    meta.update({K + k: v for k, v in overrides.items()})
    return {k: v for k, v in meta.items() if v is not None}


def test_valid_metadata_loads() -> None:
    tok = Tokenizer.from_metadata(_gpt2_meta())
    assert tok.decode(tok.encode("hello there")) == "hello there"
    assert tok.bos_id is None  # a BPE vocab gets no guessed special ids
    assert tok.token_to_id(tok.id_to_token(5)) == 5 and tok.token_to_id("no such token") is None


@pytest.mark.parametrize("overrides, pattern", [
    ({"model": None}, "no 'tokenizer.ggml.model'"),
    ({"model": "bert"}, r"unsupported tokenizer model .*'bert'.*supported: gpt2, llama, gemma4"),
    ({"pre": "no-such-pre"}, r"unknown pre-tokenizer .*'no-such-pre'.*supported: .*llama-bpe.*qwen2"),
    ({"tokens": None}, "no 'tokenizer.ggml.tokens'"),
    ({"tokens": []}, "is empty"),
    ({"merges": None}, "needs 'tokenizer.ggml.merges'"),
    ({"merges": ["ab"]}, r"malformed merge 'ab'"),
    ({"token_type": [1, 1]}, r"'tokenizer.ggml.token_type' has 2 entries"),
    ({"add_bos_token": True}, "names no bos_token_id"),
    ({"add_eos_token": True}, "names no eos_token_id"),
])
def test_bad_metadata(overrides: dict[str, Any], pattern: str) -> None:
    meta = _gpt2_meta()
    for key, value in overrides.items():
        if value is None:
            meta.pop(K + key, None)
        else:
            meta[K + key] = value
    with pytest.raises(TokenizerError, match=pattern):
        Tokenizer.from_metadata(meta)


def test_missing_pre_means_default() -> None:
    meta = _gpt2_meta()
    del meta[K + "pre"]
    assert Tokenizer.from_metadata(meta).pre == "default"


def test_special_ids_out_of_range_are_ignored() -> None:
    tok = Tokenizer.from_metadata(_gpt2_meta(bos_token_id=10**6, eos_token_id=5))
    assert tok.bos_id is None and tok.eos_id == 5 and tok.is_eog(5)


def test_scores_too_short_for_llama() -> None:
    tokens, scores, types = fx.spm_tokens_scores_types()
    meta = {K + "model": "llama", K + "tokens": tokens, K + "scores": scores[:10], K + "token_type": types}
    with pytest.raises(TokenizerError, match="'tokenizer.ggml.scores' has 10 entries"):
        Tokenizer.from_metadata(meta)


def test_bytes_values_are_accepted() -> None:
    meta = _gpt2_meta()
    meta[K + "model"] = b"gpt2"
    meta[K + "tokens"] = [t.encode() for t in meta[K + "tokens"]]
    meta[K + "merges"] = [m.encode() for m in meta[K + "merges"]]
    tok = Tokenizer.from_metadata(meta)
    assert tok.decode(tok.encode("bytes ok")) == "bytes ok"


def test_encode_needs_str() -> None:
    tok = Tokenizer.from_metadata(_gpt2_meta())
    with pytest.raises(TokenizerError, match="takes a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + b"\0" * 40)
    with pytest.raises(TokenizerError, match="bad magic"):
        Tokenizer.from_gguf(tmp_path / "x.gguf")
    (tmp_path / "short.gguf").write_bytes(b"GG")
    with pytest.raises(TokenizerError, match="not a GGUF file"):
        Tokenizer.from_gguf(tmp_path / "short.gguf")


def test_truncated_gguf(tmp_path: Path) -> None:
    full = fx.gpt2_gguf(tmp_path / "full.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(full[: len(full) // 2])
    with pytest.raises(TokenizerError, match="truncated"):
        Tokenizer.from_gguf(tmp_path / "cut.gguf")


def test_gguf_without_tokenizer(tmp_path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "none.gguf"), "llama")
    w.add_uint32("llama.block_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="carries no tokenizer"):
        Tokenizer.from_gguf(tmp_path / "none.gguf")
