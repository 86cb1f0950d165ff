"""Tiny tokenizers made with the `tokenizers` library, and GGUF files written from them.

Each fixture tokenizer is trained from a fixed corpus (a few Python standard-library
modules plus multilingual sample text), so it is deterministic for a given Python. The
GGUF writers lay out `tokenizer.*` metadata the way llama.cpp's converter does for the
corresponding model family; the trained `tokenizers.Tokenizer` stays the independent
reference the tests compare against.
"""
from __future__ import annotations

import json
import os
import random
import sys
import tarfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import gguf
from tokenizers import AddedToken, Regex, Tokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parent.parent

# Split regexes as the original tokenizer.json files of these families write them.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTILINGUAL = """\
The quick brown fox jumps over the lazy dog. I'm sure it's fine; we'll see, they've said, you'd know.
Der schnelle braune Fuchs springt über den faulen Hund. Äpfel, Öl, Übermut, Straße.
Быстрая коричневая лиса прыгает через ленивую собаку. нещо на Български.
敏捷的棕色狐狸跳过了懒狗。我想在苹果公司工作。東京は日本の首都です。ひらがな カタカナ
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 한국어 텍스트.
الثعلب البني السريع يقفز فوق الكلب الكسول. नमस्ते दुनिया। สวัสดีชาวโลก
Emoji: 🚀 🦙🦙 😶‍🌫️ 👍🏽 🇫🇷 ✅ ❤️ and symbols: ½ ¾ € £ ¥ © ® ™ → ⇒ ∀ ∃ ∑ ∫ ≤ ≥ ≠
Numbers: 0 1 12 123 1234 12345 3.14159 1e-10 0xFF 1,000,000 2024-06-01 12:30:45
Whitespace:\ttabs\t\tand  double  spaces   and\n\nnewlines\r\nwindows   trailing\x20\x20\x20
"""


def _stdlib_sources() -> str:
    root = Path(os.__file__).resolve().parent
    names = ["argparse.py", "textwrap.py", "difflib.py", "string.py", "json/decoder.py", "json/encoder.py",
             "shlex.py", "fractions.py"]
    return "\n".join((root / n).read_text(encoding="utf-8") for n in names if (root / n).is_file())


@lru_cache(maxsize=1)
def corpus_lines() -> tuple[str, ...]:
    """Training text, one entry per line."""
    text = _stdlib_sources() + "\n" + MULTILINGUAL * 20
    return tuple(text.splitlines(keepends=True))


def _byte_level_alphabet() -> list[str]:
    return pre_tokenizers.ByteLevel.alphabet()


def _train_byte_level(pre: Any, vocab_size: int, specials: list[str], user_defined: list[str],
                      ignore_merges: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=_byte_level_alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    if ignore_merges:
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    # Added after training, so their ids follow the learned vocabulary (as in Qwen and Llama 3).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if user_defined:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
    return tok


@lru_cache(maxsize=None)
def qwen2_like() -> Tokenizer:
    """Byte-level BPE with Qwen2's split regex and ChatML tokens; no BOS is added."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _train_byte_level(pre, 3000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"],
                             ["<tool_call>", "</tool_call>"])


@lru_cache(maxsize=None)
def llama3_like() -> Tokenizer:
    """Byte-level BPE with Llama 3's split regex, ignore_merges, and BOS added by a post-processor."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = _train_byte_level(pre, 3000, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                        "<|end_header_id|>", "<|eot_id|>"], [], ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    return tok


@lru_cache(maxsize=None)
def gpt2_like() -> Tokenizer:
    """Byte-level BPE with GPT-2's built-in regex."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return _train_byte_level(pre, 2500, ["<|endoftext|>"], [])


SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_BYTES = [f"<0x{b:02X}>" for b in range(256)]


@lru_cache(maxsize=1)
def spm_trained_vocab() -> dict[str, int]:
    """Vocabulary of a SentencePiece-style BPE (U+2581 word marks, byte-fallback tokens).

    The alphabet is limited so that rare characters (CJK, emoji) have no token and go
    through byte fallback.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, min_frequency=2, show_progress=False, limit_alphabet=120,
                                  special_tokens=SPM_SPECIALS + SPM_BYTES)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return dict(tok.get_vocab())


SPM_CONTROL = ["<|im_start|>", "<|im_end|>"]
SPM_USER_DEFINED = ["<sep_ud>"]


def spm_tokens_scores_types() -> tuple[list[str], list[float], list[int]]:
    """Tokens by id with SentencePiece-like scores (earlier pieces score higher) and llama.cpp types."""
    vocab = spm_trained_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tokens += SPM_CONTROL + SPM_USER_DEFINED
    scores = [-float(i) for i in range(len(tokens))]
    types = []
    for t in tokens:
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif t in ("<s>", "</s>") or t in SPM_CONTROL:
            types.append(gguf.TokenType.CONTROL)
        elif t in SPM_USER_DEFINED:
            types.append(gguf.TokenType.USER_DEFINED)
        elif t in SPM_BYTES:
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def spm_reference(add_space_prefix: bool = True) -> Tokenizer:
    """The HF-side tokenizer for the SentencePiece-style vocabulary, built as transformers
    converts a SentencePiece model: merges from `transformers`' own generate_merges over
    the scores, the legacy Llama normalizer/decoder, BOS added by a post-processor."""
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, types = spm_tokens_scores_types()
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t: s for t, s, k in zip(tokens, scores, types) if k == gguf.TokenType.NORMAL}
    merges = generate_merges(vocab, mergeable)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Prepend("\u2581")] if add_space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), *strip])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in SPM_SPECIALS + SPM_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in SPM_USER_DEFINED])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    return tok


# ---- GGUF writing, laid out as llama.cpp's converter does --------------------------------------------


def byte_level_gguf_fields(tok: Tokenizer) -> dict[str, Any]:
    """tokens / token types / merges of a byte-level tokenizer, as the converter derives them."""
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {a["id"]: a for a in spec["added_tokens"]}
    size = max([*vocab.values(), *added]) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [int(gguf.TokenType.UNUSED)] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, int(gguf.TokenType.NORMAL)
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = int(gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


def _add_given(fields: dict[str, Any], writers: dict[str, Any]) -> None:
    """Write each field that is given (not None), in the order of ``writers``."""
    for name, write in writers.items():
        if fields.get(name) is not None:
            write(fields[name])


def write_gguf(path: Path, arch: str, fields: dict[str, Any]) -> Path:
    """Write a tensor-less GGUF holding `fields` (keys as in gguf.Keys.Tokenizer, short names)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model(fields["model"])
    _add_given(fields, {"pre": w.add_tokenizer_pre})
    w.add_token_list(fields["tokens"])
    _add_given(fields, {"types": w.add_token_types, "scores": w.add_token_scores,
                        "merges": w.add_token_merges,
                        **{f"{role}_id": getattr(w, f"add_{role}_token_id")
                           for role in ("bos", "eos", "eot", "unk", "pad", "mask")},
                        "add_bos": w.add_add_bos_token, "add_eos": w.add_add_eos_token,
                        "add_space_prefix": w.add_add_space_prefix, "chat_template": w.add_chat_template})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def qwen2_gguf(path: Path, chat_template: str | None = None) -> Path:
    tok = qwen2_like()
    eot = tok.token_to_id("<|endoftext|>")
    return write_gguf(path, "qwen2", {"model": "gpt2", "pre": "qwen2", **byte_level_gguf_fields(tok),
                                      "bos_id": eot, "eos_id": tok.token_to_id("<|im_end|>"), "pad_id": eot,
                                      "add_bos": False, "chat_template": chat_template})


def llama3_gguf(path: Path, chat_template: str | None = None) -> Path:
    tok = llama3_like()
    return write_gguf(path, "llama", {"model": "gpt2", "pre": "llama-bpe", **byte_level_gguf_fields(tok),
                                      "bos_id": tok.token_to_id("<|begin_of_text|>"),
                                      "eos_id": tok.token_to_id("<|end_of_text|>"),
                                      "chat_template": chat_template})


def gpt2_gguf(path: Path) -> Path:
    tok = gpt2_like()
    eot = tok.token_to_id("<|endoftext|>")
    return write_gguf(path, "gpt2", {"model": "gpt2", "pre": "gpt-2", **byte_level_gguf_fields(tok),
                                     "bos_id": eot, "eos_id": eot})


def spm_gguf(path: Path, add_space_prefix: bool | None = None, chat_template: str | None = None) -> Path:
    tokens, scores, types = spm_tokens_scores_types()
    return write_gguf(path, "llama", {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores,
                                      "types": types, "bos_id": 1, "eos_id": 2, "unk_id": 0,
                                      "add_bos": True, "add_eos": False, "add_space_prefix": add_space_prefix,
                                      "chat_template": chat_template})


# ---- test strings ---------------------------------------------------------------------------------

FIXED_STRINGS: tuple[str, ...] = (
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n \n\n \t\t \t\n  \n",
    "Hello world", " Hello world", "Hello World!", "Hello, world!", "  leading and trailing  ",
    "I'm sure it's fine; we'll see, they've said, you'd know. I'VE WE'LL 'tis 'RE",
    "Äpfel über Straße", "нещо на Български", "我想在apple工作1314151天～", "東京は日本の首都です",
    "한국어 텍스트", "الثعلب البني", "नमस्ते दुनिया", "สวัสดีชาวโลก", "e\u0301 combining a\u0308",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙", "👍🏽🇫🇷❤️", "\U0001F9D1\u200D\U0001F4BB",
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3", "1234567890" * 3,
    "------======= ''''''```````\"\"\"\"......!!!!!!??????",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\n\tif x:\n\t\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<tool_call>{}</tool_call>",
    "text<|im_end|>more", "<|im_start|><|im_end|>", "<s>Hello</s>", "<sep_ud> a<sep_ud>b",
    "<|begin_of_text|>Hi<|eot_id|>", "\x00\x01\x7f control chars", "\ufeffBOM", "a" * 300,
    " " * 50 + "x", "\n" * 10, "mixed 中文 and English and 123 and 🚀",
)

_RANDOM_POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                + list(" \t\n\r.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`")
                + list("äöüßéèçñøåЖжЯя中文日本語한국어नमस्तेابت")
                + ["🚀", "🦙", "😶‍🌫️", "👍🏽", "\u0301", "  ", "'s", "'ll"])


def random_strings(seed: int, count: int, max_len: int = 40) -> list[str]:
    """Strings of random pieces from a mixed pool (fixed seed)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_RANDOM_POOL) for _ in range(rng.randint(1, max_len))) for _ in range(count)]


def corpus_samples(seed: int, count: int) -> list[str]:
    """Runs of consecutive corpus lines (fixed seed)."""
    rng = random.Random(seed)
    lines = corpus_lines()
    out = []
    for _ in range(count):
        start = rng.randrange(len(lines))
        out.append("".join(lines[start:start + rng.randint(1, 8)]))
    return out


def all_test_strings() -> list[str]:
    return [*FIXED_STRINGS, *random_strings(1234, 300), *corpus_samples(99, 100)]


# ---- llama.cpp's vocabulary test files (from the cached llama-cpp-python sdist) ----------------------------


def cached_llama_cpp_archive() -> Path | None:
    """The llama-cpp-python sdist archive if the build already cached it (never downloads)."""
    sys.path.insert(0, str(REPO / "third_party"))
    try:
        import llama_cpp_sdist
    finally:
        sys.path.pop(0)
    path = llama_cpp_sdist.cache_dir() / llama_cpp_sdist.ARCHIVE
    return path if path.is_file() else None


def extract_llama_cpp_files(archive: Path, members: Iterable[str], dest: Path) -> dict[str, Path]:
    """Extract vendor/llama.cpp/<member> files from the archive into dest (one pass over it)."""
    want = {f"llama_cpp_python-0.3.36/vendor/llama.cpp/{m}": m for m in members}
    out: dict[str, Path] = {}
    with tarfile.open(archive) as tar:
        for info in tar:
            rel = want.get(info.name)
            if rel is None or not info.isfile():
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(info)
            assert src is not None
            target.write_bytes(src.read())
            out[rel] = target
            if len(out) == len(want):
                break  # no need to decompress the rest of the archive
    return out


def read_vocab_tests(inp: Path, out: Path) -> list[tuple[str, list[int]]]:
    """Pairs (text, expected ids) from llama.cpp's .inp/.out test files."""
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    expected = out.read_text(encoding="utf-8").split("\n")
    return [(t, [int(x) for x in e.split()]) for t, e in zip(texts, expected)]
