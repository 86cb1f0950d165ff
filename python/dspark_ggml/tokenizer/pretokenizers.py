"""Pre-tokenizer regexes for byte-level BPE vocabularies, by `tokenizer.ggml.pre` name.

Each name maps to the split regexes of the model family's original tokenizer (applied in
order, each one splitting the pieces left by the previous, matches and gaps both kept) plus
the per-family flags llama.cpp attaches to the name. The regexes are written in the
Oniguruma syntax the `tokenizers` library uses, so case-insensitive groups and Unicode
classes such as \\p{Lu} are kept as the originals have them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TokenizerError

_CONTRACTIONS_CI = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS_CI}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS_CI}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SEED_CODER = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BAILING = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
           r"|\s*[\r\n]|\s+(?!\S)|\s+")
NO_CONTRACTIONS = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
MINICPM5 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
DEEPSEEK_CODER = (
    r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}",
)
FALCON = (
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"[0-9][0-9][0-9]",
)
BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How one pre-tokenizer family splits text, and the flags llama.cpp ties to its name.

    regexes: applied in order; ignore_merges: a whole pre-token found in the vocabulary is
    emitted as is (llama-3 style); add_bos: BOS is added by default (before the GGUF's
    add_bos_token overrides it); no_bos: the family has no BOS token at all.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False


_LLAMA3 = PreTokenizerSpec((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizerSpec((QWEN2,))
_GPT2 = PreTokenizerSpec((GPT2,))
_STARCODER = PreTokenizerSpec((r"\p{N}", GPT2))
_GPT4O = PreTokenizerSpec((GPT4O,))

# Names as llama.cpp's converter writes them into `tokenizer.ggml.pre`.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "default": PreTokenizerSpec(DEFAULT),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                     "lfm2"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan",
                     "solar-open", "grok-2"), _QWEN2),
    "qwen35": PreTokenizerSpec((QWEN35,)),
    # "gpt2" is not a name llama.cpp writes ("gpt-2" is); accepted as an alias.
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling",
                     "exaone4", "a.x-4.0", "mellum", "gigachat"), _GPT2),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
                     "mellum2"), _STARCODER),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizerSpec((LLAMA3,))),
    "chatglm-bpe": PreTokenizerSpec((LLAMA3,), no_bos=True),
    **dict.fromkeys(("glm4", "glm5"), PreTokenizerSpec((LLAMA3,), ignore_merges=True, no_bos=True)),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _GPT4O),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense"), PreTokenizerSpec(DEEPSEEK_V3)),
    "deepseek-coder": PreTokenizerSpec(DEEPSEEK_CODER),
    "falcon": PreTokenizerSpec(FALCON),
    "seed-coder": PreTokenizerSpec((SEED_CODER,)),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizerSpec((BAILING,))),
    "ufakzeka": PreTokenizerSpec((NO_CONTRACTIONS,)),
    "minicpm5": PreTokenizerSpec((r"\p{N}{1,3}", MINICPM5), ignore_merges=True),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizerSpec((BLOOM,))),
    "viking": PreTokenizerSpec((BLOOM, r"\p{N}")),
}


def pre_tokenizer_spec(name: str | None) -> PreTokenizerSpec:
    """The spec for `name`; a missing name means "default", as in llama.cpp."""
    if not name:
        return PRE_TOKENIZERS["default"]
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        supported = ", ".join(sorted(PRE_TOKENIZERS))
        raise TokenizerError(f"unknown pre-tokenizer 'tokenizer.ggml.pre' = {name!r}; supported: {supported}")
    return spec
