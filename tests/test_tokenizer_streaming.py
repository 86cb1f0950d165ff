"""IncrementalDetokenizer: streamed text equals the full decode and never shows a partial character."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import IncrementalDetokenizer, Tokenizer, TokenType  # noqa: E402

WRITERS = {"qwen2": fx.qwen2_gguf, "llama-bpe": fx.llama3_gguf, "spm": fx.spm_gguf}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def tok(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_gguf(WRITERS[request.param](tmp_path_factory.mktemp(request.param) / "v.gguf"))


def _stream(tok: Tokenizer, ids: list[int], special: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tok, special=special)
    chunks = [detok.add(i) for i in ids]
    chunks.append(detok.flush())
    return chunks


@pytest.mark.parametrize("special", [False, True])
def test_one_by_one_equals_full_decode(tok: Tokenizer, special: bool) -> None:
    for text in fx.all_test_strings():
        ids = tok.encode(text, parse_special=True)
        chunks = _stream(tok, ids, special)
        assert "".join(chunks) == tok.decode(ids, special=special), repr(text)
        if "\ufffd" not in text:
            assert not any("\ufffd" in c for c in chunks), (repr(text), chunks)


def test_multibyte_characters_are_split_across_tokens(tok: Tokenizer) -> None:
    # The test is only meaningful if some token holds part of a character: check that it happens.
    split_seen = False
    for text in ["🚀🦙😶‍🌫️ 中文 \ua66e\U0001d518", *fx.random_strings(5, 50)]:
        for i in tok.encode(text, add_special=False):
            try:
                tok.token_to_piece(i).decode("utf-8")
            except UnicodeDecodeError:
                split_seen = True
    assert split_seen


def test_batches_of_ids(tok: Tokenizer) -> None:
    text = "mixed 中文 and English 🚀🦙 and 123\n\tdone"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    out = detok.add(ids[:3]) + detok.add(ids[3:7]) + detok.add(ids[7:]) + detok.flush()
    assert out == tok.decode(ids)


def test_incomplete_character_is_held_then_flushed(tok: Tokenizer) -> None:
    first_byte = next(i for i in range(tok.n_vocab) if tok.token_to_piece(i) == b"\xf0"
                      and tok.token_type(i) in (TokenType.NORMAL, TokenType.BYTE))
    detok = IncrementalDetokenizer(tok)
    assert detok.add(tok.encode("ok", add_special=False)) == "ok"
    assert detok.add(first_byte) == ""
    assert detok.flush() == "\ufffd"
    # flush resets: a new stream starts clean
    assert detok.add(tok.encode("x", add_special=False)) == "x"


def test_work_per_call_is_proportional_to_new_tokens(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    original = tok._piece_bytes

    def spy(ids, special):
        ids = list(ids)
        seen.append(len(ids))
        return original(ids, special)

    monkeypatch.setattr(tok, "_piece_bytes", spy)
    detok = IncrementalDetokenizer(tok)
    for i in tok.encode("a fairly long sentence, to be streamed token by token " * 5):
        detok.add(i)
    assert seen and max(seen) == 1
