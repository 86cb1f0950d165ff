"""Tokenizer metadata (`tokenizer.ggml.*`, chat templates) from a Hugging Face tokenizer directory.

Reads tokenizer.json / tokenizer_config.json / config.json directly (no transformers). Supported:
byte-level BPE ("gpt2" in GGUF terms), the tokenizer of Qwen2/Qwen3 and Llama-3 models. The
choices follow what llama.cpp's converter writes for the same files:

* token list over the model's `vocab_size`; ids the tokenizer does not define become
  `[PAD<id>]` UNUSED entries; added tokens are CONTROL when special (or shaped like `<|...|>`),
  else USER_DEFINED;
* `tokenizer.ggml.pre` names the pre-tokenizer split rule, recognised here from the regex itself
  (llama.cpp hashes a sample tokenization instead); `--tokenizer-pre` overrides it;
* special token ids from tokenizer_config.json, completed from config.json;
* add-bos/eos/sep flags from the post-processor, completed from tokenizer_config.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gguf import GGUFValueType, TokenType

from . import gguf_keys as K
from .errors import ConversionError
from .metadata import KeyValues

# Pre-tokenizer split regexes of known byte-level BPE families -> llama.cpp pre-tokenizer name.
_SPLIT_PATTERN_NAMES = {
    # Qwen2, Qwen2.5, Qwen3 (single digits)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    # Llama 3.x (digits in groups of up to three)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
}

SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


@dataclass
class _Sources:
    model_dir: Path
    tokenizer: dict  # tokenizer.json
    tokenizer_config: Optional[dict]  # tokenizer_config.json
    config: dict  # config.json


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: invalid JSON ({e})") from None


def _load_sources(model_dir: Path) -> _Sources:
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        if (model_dir / "tokenizer.model").is_file():
            raise ConversionError(f"{model_dir}: only a SentencePiece tokenizer.model was found; "
                                  "this converter supports byte-level BPE tokenizers (tokenizer.json)")
        raise ConversionError(f"{model_dir}: no tokenizer.json (the tokenizer is taken from "
                              "this directory)")
    config_file = model_dir / "tokenizer_config.json"
    return _Sources(model_dir, _read_json(tokenizer_file),
                    _read_json(config_file) if config_file.is_file() else None,
                    _read_json(model_dir / "config.json"))


# ----------------------------------------------------------------------------------------------
# model type and pre-tokenizer


def _steps(node: Optional[dict], list_key: str) -> list[dict]:
    if not node:
        return []
    return list(node.get(list_key, [])) if node.get("type") == "Sequence" else [node]


def _check_byte_level_bpe(src: _Sources) -> None:
    model = src.tokenizer.get("model") or {}
    where = src.model_dir / "tokenizer.json"
    if model.get("type") != "BPE":
        raise ConversionError(f"{where}: tokenizer model {model.get('type')!r} is not supported "
                              "(only byte-level BPE)")
    if model.get("byte_fallback"):
        raise ConversionError(f"{where}: SentencePiece-style BPE (byte_fallback) is not supported "
                              "(only byte-level BPE)")
    if not any(s.get("type") == "ByteLevel" for s in _steps(src.tokenizer.get("pre_tokenizer"),
                                                             "pretokenizers")):
        raise ConversionError(f"{where}: the pre-tokenizer is not byte-level; only byte-level BPE "
                              "tokenizers are supported")


def identify_pre_tokenizer(tokenizer: dict) -> Optional[str]:
    """llama.cpp's name for the pre-tokenizer of a byte-level BPE tokenizer.json, if known."""
    steps = _steps(tokenizer.get("pre_tokenizer"), "pretokenizers")
    splits = [s for s in steps if s.get("type") == "Split"]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if len(byte_level) != 1 or len(steps) != len(splits) + 1:
        return None
    if not splits:
        return "gpt-2" if byte_level[0].get("use_regex", True) else None
    if len(splits) != 1 or byte_level[0].get("use_regex", True):
        return None
    pattern = (splits[0].get("pattern") or {}).get("Regex")
    if splits[0].get("behavior") != "Isolated" or splits[0].get("invert"):
        return None
    return _SPLIT_PATTERN_NAMES.get(pattern)


def _pre_tokenizer_name(src: _Sources, override: Optional[str]) -> str:
    if override:
        return override
    name = identify_pre_tokenizer(src.tokenizer)
    if name is None:
        raise ConversionError(f"{src.model_dir / 'tokenizer.json'}: unrecognised pre-tokenizer; "
                              "pass --tokenizer-pre NAME with llama.cpp's name for it (e.g. "
                              "qwen2, llama-bpe, gpt-2)")
    return name


# ----------------------------------------------------------------------------------------------
# tokens


def _looks_like_control_token(text: str) -> bool:
    """Added tokens some models forget to flag as special, recognised by their shape."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


class _RoundTrip:
    """encode-then-decode of an added token with the tokenizer itself (lazily loaded)."""

    def __init__(self, tokenizer_file: Path):
        self.tokenizer_file = tokenizer_file
        self._tok = None

    def __call__(self, text: str) -> str:
        if self._tok is None:
            from tokenizers import Tokenizer
            self._tok = Tokenizer.from_file(str(self.tokenizer_file))
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return self._tok.decode(ids, skip_special_tokens=False)


def _token_list(src: _Sources, vocab_size: int) -> tuple[list[str], list[int]]:
    by_id: dict[int, str] = {i: t for t, i in src.tokenizer["model"]["vocab"].items()}
    added = {a["id"]: a for a in src.tokenizer.get("added_tokens", [])}
    added_contents = {a["content"] for a in added.values()}
    for i, a in added.items():
        by_id[i] = a["content"]
    if max(by_id) >= vocab_size:
        raise ConversionError(f"{src.model_dir}: the tokenizer defines id {max(by_id)}, beyond the "
                              f"model's vocab_size {vocab_size}")
    round_trip = _RoundTrip(src.model_dir / "tokenizer.json")
    tokens, types = [], []
    for i in range(vocab_size):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif text in added_contents and i in added:
            # llama.cpp expects added tokens pre-normalized: show them as the tokenizer decodes them
            if not added[i].get("normalized", True):
                text = round_trip(text)
            if added[i].get("special") or _looks_like_control_token(text):
                types.append(TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(TokenType.USER_DEFINED)
            tokens.append(text)
        else:
            tokens.append(text)
            types.append(TokenType.NORMAL)
    return tokens, [int(t) for t in types]


def _merges(src: _Sources) -> list[str]:
    merges = src.tokenizer["model"].get("merges") or []
    if merges and isinstance(merges[0], list):
        # pair form (transformers >= 4.45): spaces inside a part are written as U+0120-shifted
        # characters so that "a b" stays splittable on its one real space
        shift = {" ": chr(ord(" ") + 256)}
        return [" ".join("".join(shift.get(c, c) for c in part) for part in pair) for pair in merges]
    if not all(isinstance(m, str) for m in merges):
        raise ConversionError(f"{src.model_dir / 'tokenizer.json'}: unknown merges format")
    return list(merges)


# ----------------------------------------------------------------------------------------------
# special tokens


@dataclass
class _SpecialTokens:
    names: dict[str, str]  # role -> token text (from tokenizer_config.json)
    add: dict[str, bool]  # role -> add automatically


def _token_text(entry: Any) -> Optional[str]:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def _special_id(item: dict) -> Optional[str]:
    return (item.get("SpecialToken") or {}).get("id")


def _sequence_id(item: dict) -> Optional[str]:
    return (item.get("Sequence") or {}).get("id")


def _apply_template_processing(proc: dict, st: _SpecialTokens, where: Path) -> None:
    """Derive add-bos/eos/sep from a TemplateProcessing post-processor (simple templates)."""
    single, pair = proc.get("single") or [], proc.get("pair") or []
    first = _special_id(single[0]) if len(single) > 1 else None
    last = _special_id(single[-1]) if len(single) > 1 else None
    if first is not None:
        if first not in (st.names.get("bos"), st.names.get("cls")):
            # a leading token the config does not name becomes the bos/cls token it lacks
            st.names.setdefault("bos", first)
            st.names.setdefault("cls", first)
        st.add["bos"] = first in (st.names.get("bos"), st.names.get("cls"))
    if last is not None:
        if "eos" not in st.names:
            st.names["eos"] = last
        elif last != st.names["eos"]:
            raise ConversionError(f"{where}: the post-processor appends {last!r} but the eos "
                                  f"token is {st.names['eos']!r}; this layout is not supported")
        st.add["eos"] = True
    # the pair template, less the single template's own first/last tokens: A [sep..] B
    if pair and first is not None and _special_id(pair[0]) == first:
        pair = pair[1:]
    if pair and last is not None and _special_id(pair[-1]) == last:
        pair = pair[:-1]
    if len(pair) < 3 or _sequence_id(pair[0]) != "A" or _sequence_id(pair[-1]) != "B":
        return
    separators = {st.names.get("sep"), st.names.get("eos")} - {None}
    middle = [_special_id(item) for item in pair[1:-1]]
    add_sep = (middle[0] in separators and last is None) or (
        len(middle) == 2 and middle[1] in separators)
    st.add["sep"] = add_sep
    if add_sep and "sep" not in st.names and "eos" in st.names:
        st.names["sep"] = st.names["eos"]


def _apply_post_processor(src: _Sources, st: _SpecialTokens) -> None:
    where = src.model_dir / "tokenizer.json"
    for proc in _steps(src.tokenizer.get("post_processor"), "processors"):
        kind = proc.get("type")
        if kind == "ByteLevel":
            st.add.setdefault("bos", False)
            st.add.setdefault("eos", False)
        elif kind == "TemplateProcessing":
            _apply_template_processing(proc, st, where)
        else:
            raise ConversionError(f"{where}: post-processor {kind!r} is not supported")


def _special_tokens(src: _Sources) -> _SpecialTokens:
    tc = src.tokenizer_config or {}
    names = {role: text for role in SPECIAL_ROLES
             if (text := _token_text(tc.get(f"{role}_token"))) is not None}
    # encoder-style configs name only cls/sep; they double as bos/eos
    if "bos" not in names and "cls" in names:
        names["bos"] = names["cls"]
    if "eos" not in names and "sep" in names:
        names["eos"] = names["sep"]
    st = _SpecialTokens(names, {})
    _apply_post_processor(src, st)
    for role in ("bos", "eos", "sep"):
        flag = tc.get(f"add_{role}_token")
        if isinstance(flag, bool):
            st.add.setdefault(role, flag)  # the post-processor, which really runs, wins
    return st


def _special_token_ids(src: _Sources, st: _SpecialTokens, vocab_size: int) -> dict[str, int]:
    added_ids: dict[str, int] = {}
    for a in src.tokenizer.get("added_tokens", []):
        added_ids.setdefault(a["content"], a["id"])
    ids = {}
    if src.tokenizer_config is not None:
        ids = {role: added_ids[text] for role, text in st.names.items() if text in added_ids}
    text_config = src.config.get("text_config") or {}
    for role in SPECIAL_ROLES:
        value = src.config.get(f"{role}_token_id")
        if value is None:
            value = text_config.get(f"{role}_token_id")
        if role not in ids and isinstance(value, int) and not isinstance(value, bool):
            ids[role] = value
    for role, tid in ids.items():
        if not 0 <= tid < vocab_size:
            raise ConversionError(f"{src.model_dir}: {role} token id {tid} is outside the "
                                  f"vocabulary (size {vocab_size})")
    return {role: ids[role] for role in SPECIAL_ROLES if role in ids}


# ----------------------------------------------------------------------------------------------
# chat template


def _chat_template(src: _Sources) -> Any:
    if src.tokenizer_config is None:
        return None
    template = src.tokenizer_config.get("chat_template")
    if template is not None:
        return template
    jinja = src.model_dir / "chat_template.jinja"
    if jinja.is_file():
        default = jinja.read_text(encoding="utf-8")
        extra = sorted((src.model_dir / "additional_chat_templates").glob("*.jinja"))
        if not extra:
            return default
        return [{"name": "default", "template": default}] + [
            {"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
    json_file = src.model_dir / "chat_template.json"
    if json_file.is_file():
        return _read_json(json_file).get("chat_template")
    return None


def _write_chat_template(template: Any, kv: KeyValues, where: Path) -> None:
    if template is None:
        return
    if isinstance(template, str):
        kv.string(K.CHAT_TEMPLATE, template)
        return
    if not isinstance(template, list):
        raise ConversionError(f"{where}: chat_template should be a string or a list")
    names = []
    for choice in template:
        name = "".join(c if c.isascii() and c.isalnum() else "_" for c in choice.get("name", ""))
        text = choice.get("template")
        if not name or text is None:
            continue
        if name == "default":
            kv.string(K.CHAT_TEMPLATE, text)
        else:
            names.append(name)
            kv.string(K.CHAT_TEMPLATE_NAMED.format(name=name), text)
    if names:
        kv.array(K.CHAT_TEMPLATE_NAMES, names, GGUFValueType.STRING)


def _normalizer_flags(node: Optional[dict], flags: dict[str, bool]) -> None:
    if not node:
        return
    kind = node.get("type")
    if kind == "Lowercase":
        flags["lowercase"] = True
    elif kind == "StripAccents":
        flags["strip_accents"] = True
    elif kind == "BertNormalizer":
        for key in ("lowercase", "strip_accents"):
            if key in node and node[key] is not None:
                flags[key] = bool(node[key])
    elif kind == "Sequence":
        for child in node.get("normalizers", []):
            _normalizer_flags(child, flags)


# ----------------------------------------------------------------------------------------------


def load_sources(model_dir: Path) -> _Sources:
    """tokenizer.json, tokenizer_config.json and config.json of a model directory."""
    return _load_sources(Path(model_dir))


def special_tokens(src: _Sources, vocab_size: int) -> tuple[_SpecialTokens, dict[str, int]]:
    """Named special tokens with their add-automatically flags, and their ids by role."""
    st = _special_tokens(src)
    return st, _special_token_ids(src, st, vocab_size)


def write_special_vocab_kv(src: _Sources, merges: list[str], st: _SpecialTokens,
                           ids: dict[str, int], kv: KeyValues) -> None:
    """Merges, special token ids, add-bos/eos/sep flags and chat templates: the keys llama.cpp's
    SpecialVocab writes whatever the tokenizer model."""
    if merges:
        kv.array(K.MERGES, merges, GGUFValueType.STRING)
    for role, tid in ids.items():
        kv.u32(K.SPECIAL_TOKEN_ID[role], tid)
    for role in ("bos", "eos", "sep"):
        if role in st.add:
            kv.boolean(K.ADD_SPECIAL_TOKEN[role], st.add[role])
    _write_chat_template(_chat_template(src), kv, src.model_dir)


def merges_of(src: _Sources) -> list[str]:
    return _merges(src)


def write_tokenizer_kv(model_dir: Path, vocab_size: int, kv: KeyValues, *,
                       add_space_prefix_key: bool = False,
                       pre_override: Optional[str] = None) -> dict[str, int]:
    """Add the tokenizer keys for the tokenizer in `model_dir`; returns the special token ids.

    `add_space_prefix_key`: copy tokenizer_config's `add_prefix_space` (llama.cpp does this for
    the `llama` architecture only)."""
    src = _load_sources(Path(model_dir))
    _check_byte_level_bpe(src)
    tokens, types = _token_list(src, vocab_size)
    merges = _merges(src)
    st = _special_tokens(src)
    ids = _special_token_ids(src, st, vocab_size)

    kv.string(K.TOKENIZER_MODEL, "gpt2")
    kv.string(K.TOKENIZER_PRE, _pre_tokenizer_name(src, pre_override))
    kv.array(K.TOKENS, tokens, GGUFValueType.STRING)
    kv.array(K.TOKEN_TYPES, types, GGUFValueType.INT32)
    write_special_vocab_kv(src, merges, st, ids, kv)
    flags: dict[str, bool] = {}
    _normalizer_flags(src.tokenizer.get("normalizer"), flags)
    if "lowercase" in flags:
        kv.boolean(K.NORMALIZER_LOWERCASE, flags["lowercase"])
    if "strip_accents" in flags:
        kv.boolean(K.NORMALIZER_STRIP_ACCENTS, flags["strip_accents"])
    prefix_space = (src.tokenizer_config or {}).get("add_prefix_space")
    if add_space_prefix_key and isinstance(prefix_space, bool):
        kv.boolean(K.ADD_SPACE_PREFIX, prefix_space)
    return ids
