"""SentencePiece-style vocabularies (tokenizer.ggml.model = "llama"): scores, byte-fallback
tokens, the U+2581 space mark and the add-space-prefix rule."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import Tokenizer, TokenType  # noqa: E402


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_gguf(fx.spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf"))


@pytest.fixture(scope="module")
def spm_ref():
    return fx.spm_reference(add_space_prefix=True)


def _score_merge_reference(text: str, tokens: list[str], scores: list[float], types: list[int]) -> list[int]:
    """SentencePiece BPE written out directly: join the adjacent pair whose concatenation is the
    best-scoring normal token (leftmost on ties) until none is left; characters without a token
    become byte tokens."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == TokenType.NORMAL}
    symbols = list(text)
    while True:
        best = None
        for k in range(len(symbols) - 1):
            joined = symbols[k] + symbols[k + 1]
            if joined in normal:
                key = (-scores[normal[joined]], k)
                best = key if best is None or key < best else best
        if best is None:
            break
        k = best[1]
        symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]
    out: list[int] = []
    byte_ids = {t: i for i, t in enumerate(tokens) if types[i] == TokenType.BYTE}
    for s in symbols:
        if s in normal:
            out.append(normal[s])
        else:
            out.extend(byte_ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
    return out


def test_properties(spm: Tokenizer) -> None:
    assert spm.model == "llama"
    assert (spm.bos_id, spm.eos_id, spm.unk_id) == (1, 2, 0)
    assert spm.add_bos and not spm.add_eos
    assert spm.eog_ids == {2, spm.token_to_id("<|im_end|>")}
    assert spm.token_type(0) == TokenType.UNKNOWN
    assert spm.token_type(spm.token_to_id("<0x41>")) == TokenType.BYTE


def test_encode_matches_hf(spm: Tokenizer, spm_ref) -> None:
    spm_ref.encode_special_tokens = True
    try:
        for text in fx.all_test_strings():
            assert spm.encode(text) == spm_ref.encode(text, add_special_tokens=True).ids, repr(text)
            assert spm.encode(text, add_special=False) == spm_ref.encode(text, add_special_tokens=False).ids
    finally:
        spm_ref.encode_special_tokens = False


def test_encode_parse_special_matches_hf(spm: Tokenizer, spm_ref) -> None:
    for text in fx.FIXED_STRINGS:
        got = spm.encode(text, parse_special=True)
        assert got == spm_ref.encode(text, add_special_tokens=True).ids, repr(text)


def test_space_prefix_after_each_special_token(spm: Tokenizer) -> None:
    # llama.cpp prefixes a space to every text run that follows a special token (or the start)
    ids = spm.encode("<|im_start|>hi", add_special=False, parse_special=True)
    assert ids[0] == spm.token_to_id("<|im_start|>")
    assert spm.id_to_token(ids[1]).startswith("\u2581")


def test_matches_direct_score_merging(spm: Tokenizer) -> None:
    tokens, scores, types = fx.spm_tokens_scores_types()
    for text in [*fx.FIXED_STRINGS[:30], *fx.random_strings(7, 150), *fx.corpus_samples(3, 30)]:
        if any(t in text for t in ("<|im_", "<sep_ud>", "<s>", "</s>", "<unk>")):
            continue
        escaped = ("\u2581" + text).replace(" ", "\u2581") if text else ""
        expected = _score_merge_reference(escaped, tokens, scores, types)
        assert spm.encode(text, add_special=False) == expected, repr(text)


def test_byte_fallback_used_for_rare_characters(spm: Tokenizer) -> None:
    ids = spm.encode("\ua66e\U0001d518", add_special=False)  # not in the training text
    byte_pieces = [spm.token_to_piece(i) for i in ids if spm.token_type(i) == TokenType.BYTE]
    assert b"".join(byte_pieces) == "\ua66e\U0001d518".encode()
    assert spm.decode(ids) == "\ua66e\U0001d518"


@pytest.mark.parametrize("parse_special", [False, True])
def test_decode_matches_hf(spm: Tokenizer, spm_ref, parse_special: bool) -> None:
    spm_ref.encode_special_tokens = not parse_special
    try:
        for text in fx.all_test_strings():
            ids = spm_ref.encode(text, add_special_tokens=True).ids
            assert spm.decode(ids) == spm_ref.decode(ids, skip_special_tokens=True), repr(text)
            assert spm.decode(ids, special=True) == spm_ref.decode(ids, skip_special_tokens=False), repr(text)
            # Lossless unless an added token is parsed: the text after one gets its own space prefix.
            if not parse_special and "<sep_ud>" not in text:
                assert spm.decode(ids) == text, repr(text)
    finally:
        spm_ref.encode_special_tokens = False


def test_no_space_prefix(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(fx.spm_gguf(tmp_path / "np.gguf", add_space_prefix=False))
    ref = fx.spm_reference(add_space_prefix=False)
    ref.encode_special_tokens = True
    for text in fx.all_test_strings()[:200]:
        ids = tok.encode(text, add_special=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, repr(text)
        assert tok.decode(ids) == ref.decode(ids) == text
    assert not tok.id_to_token(tok.encode("hello", add_special=False)[0]).startswith("\u2581")


def test_merges_key_overrides_scores(tmp_path: Path) -> None:
    # A converter may keep the original merge ranks; they then take precedence over scores.
    tokens, scores, types = fx.spm_tokens_scores_types()
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": []}
    no_merges = Tokenizer.from_metadata(meta)  # (GGUFWriter drops empty arrays, so no file here)
    pieces = [no_merges.id_to_token(i) for i in no_merges.encode("the", add_special=False)]
    assert pieces == ["\u2581", "t", "h", "e"]
    fields = {"model": "llama", "tokens": tokens, "scores": scores, "types": types,
              "merges": ["\u2581 t", "h e", "\u2581t he"]}
    three = Tokenizer.from_gguf(fx.write_gguf(tmp_path / "m3.gguf", "llama", fields))
    assert [three.id_to_token(i) for i in three.encode("the hen", add_special=False)] == [
        "\u2581the", "\u2581", "he", "n"]
    scored = Tokenizer.from_gguf(fx.spm_gguf(tmp_path / "s.gguf"))
    assert [scored.id_to_token(i) for i in scored.encode("the", add_special=False)] == ["\u2581the"]
