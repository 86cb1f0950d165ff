"""The tokenizer description read from a GGUF's `tokenizer.*` metadata, following llama.cpp.

`Vocab.from_metadata` checks the keys, applies llama.cpp's per-model defaults (special ids,
add-BOS/EOS, add-space-prefix), and works out the end-of-generation tokens the way
llama.cpp does (explicit ids plus well-known token texts).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Mapping, Sequence

from .errors import TokenizerError
from .pretokenizers import PreTokenizerSpec, pre_tokenizer_spec


class TokenType(IntEnum):
    """`tokenizer.ggml.token_type` values (llama.cpp's llama_token_type)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


K = "tokenizer.ggml."
SUPPORTED_MODELS = ("gpt2", "llama", "gemma4")

# Texts llama.cpp recognises when the GGUF names no id for these roles (first match wins here;
# llama.cpp's own pick among several candidates depends on hash order).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
# Every token with one of these texts ends generation (llama.cpp's list).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))


@dataclass
class SpecialIds:
    """Ids of the tokens with a role; None where the vocabulary has none."""

    bos: int | None = None
    eos: int | None = None
    eot: int | None = None
    eom: int | None = None
    unk: int | None = None
    sep: int | None = None
    pad: int | None = None
    mask: int | None = None
    fim_pre: int | None = None
    fim_suf: int | None = None
    fim_mid: int | None = None
    fim_pad: int | None = None
    fim_rep: int | None = None
    fim_sep: int | None = None


# Metadata key suffix for each role; later keys in the list are deprecated aliases.
_ID_KEYS: tuple[tuple[str, str], ...] = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id"),
    ("unk", "unknown_token_id"), ("sep", "seperator_token_id"), ("pad", "padding_token_id"),
    ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
    ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
    ("fim_mid", "middle_token_id"),
)


@dataclass
class Vocab:
    """Everything the tokenizer needs, in plain Python form.

    tokens/types/scores are indexed by token id; merges are (left, right) pairs in rank order
    (gpt2 model, or a llama model whose GGUF carries merges); chat_templates maps "default"
    (`tokenizer.chat_template`) and each named template to its source.
    """

    model: str
    pre: str
    pre_spec: PreTokenizerSpec | None
    tokens: list[str]
    types: list[int]
    scores: list[float] | None
    merges: list[tuple[str, str]] | None
    ids: SpecialIds
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    chat_templates: dict[str, str] = field(default_factory=dict)
    token_to_id: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Vocab":
        """Build from GGUF metadata (keys to Python values, arrays as lists)."""
        model = _model_name(meta)
        tokens = _token_list(meta)
        types = _token_types(meta, len(tokens))
        token_to_id = _first_ids(tokens)
        pre, spec = _pre(meta, model)
        ids = _special_ids(meta, model, spec, len(tokens))
        add_bos, add_eos = _add_special_defaults(meta, model, spec)
        if add_bos and ids.bos is None:
            raise TokenizerError("the GGUF asks to add a BOS token (add_bos_token) but names no bos_token_id")
        if add_eos and ids.eos is None:
            raise TokenizerError(
                "the GGUF asks to add an EOS token (add_eos_token) but names no eos_token_id")
        _detect_roles_by_text(ids, token_to_id, types)
        eog = _eog_ids(ids, tokens, token_to_id, types)
        return cls(
            model=model, pre=pre, pre_spec=spec, tokens=tokens, types=types,
            scores=_scores(meta, len(tokens)), merges=_merges(meta, model),
            ids=ids, add_bos=add_bos, add_eos=add_eos,
            # Only the SentencePiece-style model prefixes a space (BPE models ignore the key).
            add_space_prefix=model == "llama" and bool(meta.get(K + "add_space_prefix", True)),
            eog_ids=eog, chat_templates=_chat_templates(meta), token_to_id=token_to_id,
        )


def _as_str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="surrogateescape")
    return str(value)


def _model_name(meta: Mapping[str, Any]) -> str:
    if K + "model" not in meta:
        raise TokenizerError("the GGUF metadata has no 'tokenizer.ggml.model' key: it carries no tokenizer")
    model = _as_str(meta[K + "model"])
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(f"unsupported tokenizer model 'tokenizer.ggml.model' = {model!r}; "
                             f"supported: {', '.join(SUPPORTED_MODELS)}")
    return model


# gemma4: BPE over raw UTF-8 with U+2581 for spaces, merged across whole lines (llama.cpp splits
# only at newlines); BOS is always added.
GEMMA4_SPEC = PreTokenizerSpec(("[^\n]+|[\n]+",), add_bos=True)


def _pre(meta: Mapping[str, Any], model: str) -> tuple[str, PreTokenizerSpec | None]:
    if model == "gpt2":
        pre = _as_str(meta.get(K + "pre") or "default")
        return pre, pre_tokenizer_spec(pre)
    if model == "gemma4":
        return "gemma4", GEMMA4_SPEC
    return _as_str(meta.get(K + "pre") or ""), None


def _token_list(meta: Mapping[str, Any]) -> list[str]:
    raw = meta.get(K + "tokens")
    if raw is None:
        raise TokenizerError("the GGUF metadata has no 'tokenizer.ggml.tokens' (the token list)")
    tokens = list(raw) if set(map(type, raw)) == {str} else [_as_str(t) for t in raw]
    if not tokens:
        raise TokenizerError("'tokenizer.ggml.tokens' is empty")
    return tokens


def _token_types(meta: Mapping[str, Any], n: int) -> list[int]:
    raw = meta.get(K + "token_type")
    if raw is None:
        return [int(TokenType.NORMAL)] * n  # llama.cpp treats a missing list as all-normal
    types = list(map(int, raw))
    if len(types) < n:
        raise TokenizerError(f"'tokenizer.ggml.token_type' has {len(types)} entries for {n} tokens")
    return types[:n]


def _scores(meta: Mapping[str, Any], n: int) -> list[float] | None:
    raw = meta.get(K + "scores")
    if raw is None:
        return None
    scores = list(map(float, raw))
    if len(scores) < n:
        raise TokenizerError(f"'tokenizer.ggml.scores' has {len(scores)} entries for {n} tokens")
    return scores[:n]


def _split_merge(entry: str) -> tuple[str, str]:
    # Split at the first space after position 0, as llama.cpp does: a pair may start with a space.
    pos = entry.find(" ", 1)
    if pos < 0:
        raise TokenizerError(f"malformed merge {entry!r} in 'tokenizer.ggml.merges' (expected 'left right')")
    return entry[:pos], entry[pos + 1:]


def _merges(meta: Mapping[str, Any], model: str) -> list[tuple[str, str]] | None:
    raw = meta.get(K + "merges")
    if raw is None:
        if model != "llama":
            raise TokenizerError(
                f"a {model!r} (BPE) tokenizer needs 'tokenizer.ggml.merges', which the GGUF lacks")
        return None
    entries = [m if isinstance(m, str) else _as_str(m) for m in raw]
    # Inline split (a function call per merge costs ~0.1 s on a 150k-merge vocabulary).
    cuts = [m.find(" ", 1) for m in entries]
    if -1 in cuts:
        _split_merge(entries[cuts.index(-1)])  # raises, naming the malformed entry
    return [(m[:c], m[c + 1:]) for m, c in zip(entries, cuts)]


def _first_ids(tokens: Sequence[str]) -> dict[str, int]:
    # Duplicate texts keep their first id (llama.cpp refuses duplicates altogether).
    # Built from the end so that the first id of a duplicate is written last and wins.
    return dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1)))


def _special_ids(meta: Mapping[str, Any], model: str, spec: PreTokenizerSpec | None, n: int) -> SpecialIds:
    ids = SpecialIds()
    if model == "llama":
        # SentencePiece convention; a BPE vocab gets no guessed defaults (llama.cpp's id 11
        # would make ',' the EOS of a GPT-2 vocabulary).
        ids.bos, ids.eos, ids.unk = 1, 2, 0
    if spec is not None and spec.no_bos:
        ids.bos = None
    for role, suffix in _ID_KEYS:
        if getattr(ids, role) is not None and getattr(ids, role) >= n:
            setattr(ids, role, None)
        value = meta.get(K + suffix)
        if value is not None and 0 <= int(value) < n:
            setattr(ids, role, int(value))
    return ids


def _add_special_defaults(meta: Mapping[str, Any], model: str,
                          spec: PreTokenizerSpec | None) -> tuple[bool, bool]:
    add_bos = model == "llama" or bool(spec is not None and spec.add_bos)
    add_eos = False
    if K + "add_bos_token" in meta and model != "gemma4":  # llama.cpp forces BOS on for gemma4
        add_bos = bool(meta[K + "add_bos_token"])
    if K + "add_eos_token" in meta:
        add_eos = bool(meta[K + "add_eos_token"])
    return add_bos, add_eos


def _mark_control(types: list[int], token_id: int) -> None:
    # llama.cpp forces tokens it recognises by text to control type (hidden when decoding).
    if types[token_id] != TokenType.CONTROL:
        types[token_id] = TokenType.CONTROL


def _detect_roles_by_text(ids: SpecialIds, token_to_id: Mapping[str, int], types: list[int]) -> None:
    for role, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pad", _FIM_PAD_TEXTS),
                        ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):
        if getattr(ids, role) is not None:
            continue
        for text in texts:
            if text in token_to_id:
                setattr(ids, role, token_to_id[text])
                _mark_control(types, token_to_id[text])
                break


def _eog_ids(ids: SpecialIds, tokens: Sequence[str], token_to_id: Mapping[str, int],
             types: list[int]) -> frozenset[int]:
    eog = {i for i in (ids.fim_pad, ids.fim_rep, ids.fim_sep) if i is not None}
    for text in _EOG_TEXTS:
        if text in token_to_id:
            eog.add(token_to_id[text])
            _mark_control(types, token_to_id[text])
    eog.update(i for i in (ids.eos, ids.eot, ids.eom) if i is not None)
    texts = {tokens[i]: i for i in eog}
    # gpt-oss / solar-open: "<|end|>" only ends a message there, not the generation.
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        types[texts["<|end|>"]] = TokenType.USER_DEFINED
    # gemma-4 / plamo-2 use "</s>" as an ordinary token.
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        types[texts["</s>"]] = TokenType.NORMAL
    return frozenset(eog)


def _chat_templates(meta: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    if meta.get("tokenizer.chat_template") is not None:
        out["default"] = _as_str(meta["tokenizer.chat_template"])
    for name in meta.get("tokenizer.chat_templates") or ():
        name = _as_str(name)
        source = meta.get(f"tokenizer.chat_template.{name}")
        if source is not None:
            out[name] = _as_str(source)
    return out
