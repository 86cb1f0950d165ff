"""Byte-level BPE tokenizers (tokenizer.ggml.model = "gpt2") built from GGUF metadata must
encode and decode exactly like the Hugging Face tokenizers they were converted from."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import Tokenizer, TokenizerError, TokenType  # noqa: E402

FLAVOURS: dict[str, tuple[Callable, Callable[[Path], Path]]] = {
    "qwen2": (fx.qwen2_like, fx.qwen2_gguf),
    "llama-bpe": (fx.llama3_like, fx.llama3_gguf),
    "gpt-2": (fx.gpt2_like, fx.gpt2_gguf),
}


@pytest.fixture(scope="module", params=sorted(FLAVOURS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(name, HF reference tokenizer, our Tokenizer loaded from the GGUF written for it)."""
    make_ref, write = FLAVOURS[request.param]
    path = write(tmp_path_factory.mktemp(request.param) / "vocab.gguf")
    return request.param, make_ref(), Tokenizer.from_gguf(path)


def test_metadata_read_back(pair) -> None:
    name, ref, tok = pair
    assert tok.model == "gpt2"
    assert tok.pre == name
    assert tok.n_vocab == ref.get_vocab_size()


def test_encode_matches_hf(pair) -> None:
    _, ref, tok = pair
    ref.encode_special_tokens = True  # special-token texts are plain text unless parse_special
    try:
        for text in fx.all_test_strings():
            expected = ref.encode(text, add_special_tokens=False).ids
            assert tok.encode(text, add_special=False) == expected, repr(text)
    finally:
        ref.encode_special_tokens = False


def test_encode_parse_special_matches_hf(pair) -> None:
    _, ref, tok = pair
    for text in fx.FIXED_STRINGS:
        got = tok.encode(text, add_special=False, parse_special=True)
        assert got == ref.encode(text, add_special_tokens=False).ids, repr(text)


def test_parse_special_changes_control_tokens_only(pair) -> None:
    name, ref, tok = pair
    special = {"qwen2": "<|im_end|>", "llama-bpe": "<|eot_id|>", "gpt-2": "<|endoftext|>"}[name]
    sid = ref.token_to_id(special)
    assert tok.encode(f"a{special}b", add_special=False, parse_special=True).count(sid) == 1
    assert sid not in tok.encode(f"a{special}b", add_special=False, parse_special=False)
    if name == "qwen2":
        # user-defined (non-special) added tokens are recognised either way, as in llama.cpp
        ud = ref.token_to_id("<tool_call>")
        assert tok.token_type(ud) == TokenType.USER_DEFINED
        assert ud in tok.encode("x<tool_call>y", add_special=False, parse_special=False)


def test_decode_matches_hf(pair) -> None:
    _, ref, tok = pair
    for text in fx.all_test_strings():
        ids = ref.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, special=True) == ref.decode(ids, skip_special_tokens=False), repr(text)
        assert tok.decode(ids, special=False) == ref.decode(ids, skip_special_tokens=True), repr(text)


def test_round_trip(pair) -> None:
    _, _, tok = pair
    for text in fx.all_test_strings():
        assert tok.decode(tok.encode(text, add_special=False)) == text, repr(text)
        assert tok.decode(tok.encode(text, parse_special=True), special=True) == (
            tok.decode([tok.bos_id], special=True) if tok.add_bos else "") + text, repr(text)


def test_bos_eos_defaults(pair) -> None:
    name, ref, tok = pair
    if name == "llama-bpe":
        # llama-bpe adds BOS by default (no add_bos_token key in this GGUF), as the HF post-processor does
        assert tok.add_bos and tok.bos_id == ref.token_to_id("<|begin_of_text|>")
        assert tok.encode("Hello world") == ref.encode("Hello world", add_special_tokens=True).ids
        assert tok.encode("") == [tok.bos_id]
    else:
        assert not tok.add_bos
        assert tok.encode("Hello world") == tok.encode("Hello world", add_special=False)
    assert not tok.add_eos


def test_eog_ids(pair) -> None:
    name, ref, tok = pair
    expected = {
        "qwen2": {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>"},
        "llama-bpe": {"<|end_of_text|>", "<|eot_id|>"},
        "gpt-2": {"<|endoftext|>"},
    }[name]
    assert {tok.id_to_token(i) for i in tok.eog_ids} == expected
    assert all(tok.is_eog(i) for i in tok.eog_ids)
    assert not tok.is_eog(ref.token_to_id("!"))
    if name == "qwen2":
        assert tok.eot_id == ref.token_to_id("<|im_end|>")
        assert tok.eos_id == ref.token_to_id("<|im_end|>")
        assert tok.pad_id == ref.token_to_id("<|endoftext|>")


def test_token_to_piece(pair) -> None:
    _, ref, tok = pair
    space_word = ref.encode(" the", add_special_tokens=False).ids
    assert b"".join(tok.token_to_piece(i) for i in space_word) == b" the"
    eot = ref.token_to_id("<|endoftext|>") or ref.token_to_id("<|end_of_text|>")
    assert tok.token_to_piece(eot) == ref.id_to_token(eot).encode()
    assert tok.token_to_piece(eot, special=False) == b""
    # a lone lead byte of a multi-byte character is a piece of one byte
    lead = ref.token_to_id("\u00e4")  # byte-level char for byte 0xE4
    assert tok.token_to_piece(lead) == b"\xe4"


def test_out_of_range_ids_raise(pair) -> None:
    _, _, tok = pair
    for bad in ([tok.n_vocab], [-1], [0, 1, tok.n_vocab + 5]):
        with pytest.raises(TokenizerError, match="out of range"):
            tok.decode(bad)
    with pytest.raises(TokenizerError, match="out of range"):
        tok.token_to_piece(tok.n_vocab)


def test_default_pre_tokenizer_splits_digits_in_threes(tmp_path: Path) -> None:
    # "default" (also used when tokenizer.ggml.pre is absent) isolates punctuation runs and
    # cuts digit runs into groups of three.
    fields = fx.byte_level_gguf_fields(fx.gpt2_like())
    tok = Tokenizer.from_gguf(fx.write_gguf(tmp_path / "d.gguf", "gpt2", {"model": "gpt2", **fields}))
    assert tok.pre == "default"
    pieces = [tok.decode([i]) for i in tok.encode("x 1234567", add_special=False)]
    assert "".join(pieces) == "x 1234567"
    digits = [p for p in pieces if p.strip().isdigit()]
    assert all(len(p) <= 3 for p in digits) and "".join(digits) == "1234567"
    for text in fx.FIXED_STRINGS:
        assert tok.decode(tok.encode(text, add_special=False)) == text
