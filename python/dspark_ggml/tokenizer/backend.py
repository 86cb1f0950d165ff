"""Build the `tokenizers.Tokenizer` that does the encoding (in Rust, so long texts are fast).

Decoding does not go through it: the Python side keeps a bytes-per-token table so that
decoding and streaming follow llama.cpp's piece rules exactly.
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .spm_merges import merges_from_scores
from .vocab import TokenType, Vocab

_SPACE_MARK = "\u2581"  # SentencePiece's visible space


def build_backend(vocab: Vocab) -> Tokenizer:
    """A `tokenizers.Tokenizer` that encodes like llama.cpp for this vocabulary.

    BOS/EOS are not added by it (the caller does that). Control and unknown-type tokens are
    registered as special added tokens, user-defined ones as plain added tokens, so that
    toggling `encode_special_tokens` reproduces llama.cpp's parse_special switch.
    """
    builders = {"gpt2": _build_bpe, "llama": _build_spm, "gemma4": _build_space_marked_bpe}
    backend = builders[vocab.model](vocab)
    _add_special_tokens(backend, vocab)
    return backend


def _hf_vocab(vocab: Vocab) -> dict[str, int]:
    # Tokens whose text is not valid UTF-8 can't enter a Rust string; they are unreachable by
    # merges anyway and are still decoded from the Python-side piece table.
    if not _has_surrogates("".join(vocab.token_to_id)):
        return vocab.token_to_id
    return {t: i for t, i in vocab.token_to_id.items() if not _has_surrogates(t)}


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _bpe_model(hf_vocab: dict[str, int], merges: list[tuple[str, str]], **options: Any) -> models.BPE:
    try:
        return models.BPE(hf_vocab, merges, **options)
    except Exception:  # tokenizers raises a bare Exception for a merge outside the vocabulary
        # llama.cpp would never emit the result of such a merge either, so they are dropped.
        usable = [(a, b) for a, b in merges if a in hf_vocab and b in hf_vocab and a + b in hf_vocab]
        return models.BPE(hf_vocab, usable, **options)


def _build_bpe(vocab: Vocab) -> Tokenizer:
    assert vocab.pre_spec is not None and vocab.merges is not None
    hf_vocab = _hf_vocab(vocab)
    model = _bpe_model(hf_vocab, vocab.merges, ignore_merges=vocab.pre_spec.ignore_merges)
    backend = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in vocab.pre_spec.regexes]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    backend.decoder = decoders.ByteLevel()
    return backend


def _build_spm(vocab: Vocab) -> Tokenizer:
    hf_vocab = _hf_vocab(vocab)
    if vocab.merges is not None:
        merges = vocab.merges  # a converter that kept the original ranks: use them as they are
    else:
        merges = merges_from_scores(vocab.tokens, vocab.types, vocab.scores)
    has_bytes = any(t == TokenType.BYTE for t in vocab.types)
    unk = vocab.tokens[vocab.ids.unk] if vocab.ids.unk is not None else None
    model = _bpe_model(hf_vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=has_bytes)
    backend = Tokenizer(model)
    # Each text run between special tokens gets its own space prefix, as in llama.cpp.
    steps = [normalizers.Prepend(_SPACE_MARK)] if vocab.add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE_MARK)])
    backend.decoder = decoders.Sequence([decoders.Replace(_SPACE_MARK, " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    return backend


def _build_space_marked_bpe(vocab: Vocab) -> Tokenizer:
    # Ranked merges over raw UTF-8 text whose spaces became U+2581, characters without a token
    # falling back to <0xXX> byte tokens (gemma4).
    assert vocab.pre_spec is not None and vocab.merges is not None
    hf_vocab = _hf_vocab(vocab)
    has_bytes = any(t == TokenType.BYTE for t in vocab.types)
    backend = Tokenizer(_bpe_model(hf_vocab, vocab.merges, byte_fallback=has_bytes))
    backend.normalizer = normalizers.Replace(" ", _SPACE_MARK)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in vocab.pre_spec.regexes])
    backend.decoder = decoders.Sequence([decoders.Replace(_SPACE_MARK, " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    return backend


def _add_special_tokens(backend: Tokenizer, vocab: Vocab) -> None:
    special: list[AddedToken] = []
    plain: list[AddedToken] = []
    for token_id, token_type in enumerate(vocab.types):
        if token_type == TokenType.NORMAL:
            continue
        text = vocab.tokens[token_id]
        if vocab.token_to_id.get(text) != token_id or not text or _has_surrogates(text):
            continue
        if token_type in (TokenType.CONTROL, TokenType.UNKNOWN):
            special.append(AddedToken(text, special=True, normalized=False))
        elif token_type == TokenType.USER_DEFINED:
            plain.append(AddedToken(text, special=False, normalized=False))
    if special:
        backend.add_special_tokens(special)
    if plain:
        backend.add_tokens(plain)
