"""Tokenizer metadata of Gemma-4 (`tokenizer.ggml.model = "gemma4"`).

Gemma's tokenizer.json is a SentencePiece-style BPE (byte fallback, spaces as U+2581). The
keys are those llama.cpp's converter writes for it (through gguf's LlamaHfVocab), read here from
the JSON files directly:

* tokens: the model vocabulary by id, then the added tokens past it; every score is -1000;
* types: `<0xXX>` byte tokens BYTE, the tokens tokenizer_config.json names as special (roles
  and `extra_special_tokens`) CONTROL, other added tokens past the vocabulary USER_DEFINED, the
  rest NORMAL; the chat-syntax tokens below are USER_DEFINED so that they stay visible in text;
* merges, special ids, add flags and chat template as for every tokenizer; BOS is always added
  and no space prefix is.
"""
from __future__ import annotations

import re
from pathlib import Path

from gguf import GGUFValueType, TokenType

from . import gguf_keys as K
from .errors import ConversionError
from .metadata import KeyValues
from .tokenizer_meta import SPECIAL_ROLES, load_sources, merges_of, special_tokens, \
    write_special_vocab_kv

MODEL = "gemma4"
SCORE = -1000.0  # LlamaHfVocab has no scores for BPE pieces
# rendered as text by the chat parser, so never treated as control tokens
VISIBLE_TOKENS = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                            "<|tool_response>", "<tool_response|>", '<|"|>'})
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _check_model(tokenizer: dict, where: Path) -> None:
    model = tokenizer.get("model") or {}
    decoder = tokenizer.get("decoder") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback") \
            or decoder.get("type") != "Sequence":
        raise ConversionError(f"{where}: a Gemma-4 tokenizer should be a byte-fallback BPE with a "
                              "Sequence decoder (SentencePiece-style)")


def _named_specials(tokenizer_config: dict) -> set[str]:
    """Texts of the tokens transformers treats as special: the named roles and the extras."""
    def text(entry):
        return entry.get("content") if isinstance(entry, dict) else entry

    names = {text(tokenizer_config.get(f"{role}_token")) for role in SPECIAL_ROLES}
    extra = tokenizer_config.get("extra_special_tokens",
                                 tokenizer_config.get("additional_special_tokens")) or []
    names |= {text(t) for t in (extra.values() if isinstance(extra, dict) else extra)}
    return {n for n in names if isinstance(n, str)}


def _tokens(tokenizer: dict, specials: set[str], where: Path) -> tuple[list[str], list[int]]:
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    base = len(vocab)
    if sorted(vocab.values()) != list(range(base)):
        raise ConversionError(f"{where}: the vocabulary ids are not 0..{base - 1}")
    by_id = {i: t for t, i in vocab.items()}
    added = sorted((a for a in tokenizer.get("added_tokens", []) if a["id"] >= base),
                   key=lambda a: a["id"])
    if [a["id"] for a in added] != list(range(base, base + len(added))):
        raise ConversionError(f"{where}: the added tokens past the vocabulary leave gaps in the ids")
    ids_of = {**vocab, **{a["content"]: a["id"] for a in added}}
    special_ids = {ids_of[t] for t in specials if t in ids_of}
    tokens, types = [], []
    for i in range(base):
        text = by_id[i]
        if _BYTE_TOKEN.fullmatch(text):
            kind = TokenType.BYTE
        else:
            kind = TokenType.CONTROL if i in special_ids else TokenType.NORMAL
        tokens.append(text)
        types.append(kind)
    for a in added:
        tokens.append(a["content"])
        types.append(TokenType.CONTROL if a["content"] in specials else TokenType.USER_DEFINED)
    types = [TokenType.USER_DEFINED if t in VISIBLE_TOKENS else kind
             for t, kind in zip(tokens, types)]
    return tokens, [int(t) for t in types]


def write_gemma4_tokenizer_kv(model_dir: Path, vocab_size: int, kv: KeyValues) -> dict[str, int]:
    """Add the tokenizer keys of a Gemma-4 model directory; returns the special token ids."""
    src = load_sources(Path(model_dir))
    where = src.model_dir / "tokenizer.json"
    _check_model(src.tokenizer, where)
    tokens, types = _tokens(src.tokenizer, _named_specials(src.tokenizer_config or {}), where)
    if len(tokens) != vocab_size:
        # llama.cpp would write a token list and an embedding of different lengths
        raise ConversionError(f"{where}: the tokenizer defines {len(tokens)} tokens but the "
                              f"model's vocab_size is {vocab_size}")
    st, ids = special_tokens(src, vocab_size)
    kv.string(K.TOKENIZER_MODEL, MODEL)
    kv.array(K.TOKENS, tokens, GGUFValueType.STRING)
    kv.array(K.TOKEN_SCORES, [SCORE] * len(tokens), GGUFValueType.FLOAT32)
    kv.array(K.TOKEN_TYPES, types, GGUFValueType.INT32)
    write_special_vocab_kv(src, merges_of(src), st, ids, kv)
    kv.boolean(K.ADD_SPACE_PREFIX, False)
    kv.boolean(K.ADD_SPECIAL_TOKEN["bos"], True, replace=True)  # Gemma always starts with BOS
    return ids
