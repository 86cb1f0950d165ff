"""The Tokenizer: text to token ids and back, built from a GGUF's metadata alone."""
from __future__ import annotations

import os
import threading
from operator import attrgetter
from typing import Any, Iterable, Mapping, Sequence

from .backend import build_backend
from .chat_template import render_chat
from .errors import ChatTemplateError, TokenizerError
from .gguf_metadata import read_gguf_metadata
from .pieces import PieceTable
from .vocab import Vocab


class Tokenizer:
    """Encode, decode and chat-format text for the model of one GGUF file.

    Supported `tokenizer.ggml.model` values: "gpt2" (byte-level BPE, split by the regexes of
    `tokenizer.ggml.pre`), "llama" (SentencePiece-style: scores, byte-fallback tokens, the
    U+2581 space mark) and "gemma4" (ranked merges over U+2581-marked text). Behaviour follows
    llama.cpp's reading of the same keys; decoding is lossless (no clean-up of spaces before
    punctuation).
    """

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._backend = build_backend(vocab)
        self._pieces = PieceTable(vocab)
        self._strips_leading_space = vocab.add_space_prefix
        # encode_special_tokens is state on the shared backend; the lock keeps encode() thread-safe.
        self._lock = threading.Lock()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata: keys to Python values, arrays as lists (as GGUF stores them)."""
        return cls(Vocab.from_metadata(meta))

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """Build from the `tokenizer.*` metadata of the GGUF file at `path`."""
        return cls.from_metadata(read_gguf_metadata(path, prefix="tokenizer."))

    @classmethod
    def from_gguf_if_any(cls, path: str | os.PathLike[str]) -> "Tokenizer | None":
        """The GGUF's tokenizer, or None when the file carries none (a model used by token ids)."""
        meta = read_gguf_metadata(path, prefix="tokenizer.")
        return cls.from_metadata(meta) if "tokenizer.ggml.model" in meta else None

    # -- properties ---------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of tokens (ids are 0..n_vocab-1)."""
        return len(self._vocab.tokens)

    model = property(attrgetter("_vocab.model"),
                     doc='`tokenizer.ggml.model`: "gpt2", "llama" or "gemma4".')
    pre = property(attrgetter("_vocab.pre"),
                   doc='`tokenizer.ggml.pre` ("default" when a gpt2 GGUF names none; as stored for llama).')
    bos_id = property(attrgetter("_vocab.ids.bos"), doc='Beginning-of-sequence token, or None.')
    eos_id = property(attrgetter("_vocab.ids.eos"), doc='End-of-sequence token, or None.')
    eot_id = property(attrgetter("_vocab.ids.eot"),
                      doc='End-of-turn token (from the GGUF or found by its text, e.g. <|im_end|>), or None.')
    eom_id = property(attrgetter("_vocab.ids.eom"), doc='End-of-message token (<|eom_id|>), or None.')
    unk_id = property(attrgetter("_vocab.ids.unk"), doc='Unknown-text token, or None.')
    pad_id = property(attrgetter("_vocab.ids.pad"), doc='Padding token, or None.')
    mask_id = property(attrgetter("_vocab.ids.mask"), doc='Mask token, or None.')
    add_bos = property(attrgetter("_vocab.add_bos"), doc='Whether encode(add_special=True) prepends BOS.')
    add_eos = property(attrgetter("_vocab.add_eos"), doc='Whether encode(add_special=True) appends EOS.')
    eog_ids = property(attrgetter("_vocab.eog_ids"),
                       doc="Tokens that end generation: eos, eot, eom and the ones llama.cpp recognises "
                           "by text.")

    def is_eog(self, token_id: int) -> bool:
        """True if `token_id` ends generation."""
        return token_id in self._vocab.eog_ids

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary text of `token_id` (byte-level or U+2581-marked form, as stored)."""
        self._check_id(token_id)
        return self._vocab.tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        """The id whose vocabulary text is exactly `text`, or None."""
        return self._vocab.token_to_id.get(text)

    def token_type(self, token_id: int) -> int:
        """llama.cpp token type of `token_id` (a `TokenType` value), after llama.cpp's by-text fix-ups."""
        self._check_id(token_id)
        return self._vocab.types[token_id]

    @property
    def chat_template(self) -> str | None:
        """`tokenizer.chat_template`, or None."""
        return self._vocab.chat_templates.get("default")

    @property
    def backend(self) -> Any:
        """The underlying `tokenizers.Tokenizer` (it adds no BOS/EOS itself)."""
        return self._backend

    # -- encoding -------------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`.

        add_special (default True): add BOS/EOS as the GGUF's add_bos_token/add_eos_token (or
        the model's defaults) say. parse_special (default False): recognise control tokens
        written in the text (e.g. "<|im_start|>"); user-defined tokens are always recognised.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            ids = self._encode_plain(text)
        if add_special:
            if self._vocab.add_bos and self._vocab.ids.bos is not None:
                ids.insert(0, self._vocab.ids.bos)
            if self._vocab.add_eos and self._vocab.ids.eos is not None:
                ids.append(self._vocab.ids.eos)
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        # The batch "fast" path (tokenizers >= 0.21) skips offset tracking: ~2x faster on long texts.
        fast = getattr(self._backend, "encode_batch_fast", None)
        if fast is not None:
            return list(fast([text], add_special_tokens=False)[0].ids)
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    # -- decoding -------------------------------------------------------------------------

    def token_to_piece(self, token_id: int, *, special: bool = True) -> bytes:
        """Bytes of one token. special (default True): control tokens give their text, else b""."""
        self._check_id(token_id)
        return self._pieces.table(special)[token_id]

    def decode(self, ids: Iterable[int], *, special: bool = False) -> str:
        """Text of `ids`. special (default False): show control/unknown tokens as their text.

        Invalid UTF-8 becomes U+FFFD. A SentencePiece vocabulary with a space prefix loses the
        first leading space of the text (the one encode() added).
        """
        text = self._piece_bytes(ids, special).decode("utf-8", errors="replace")
        if self._strips_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def _piece_bytes(self, ids: Iterable[int], special: bool) -> bytes:
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        if not ids:
            return b""
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= len(self._vocab.tokens):
            bad = lo if lo < 0 else hi
            raise TokenizerError(f"token id {bad} is out of range (vocabulary has ids 0..{self.n_vocab - 1})")
        table = self._pieces.table(special)
        return b"".join([table[i] for i in ids])

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._vocab.tokens):
            raise TokenizerError(
                f"token id {token_id} is out of range (vocabulary has ids 0..{self.n_vocab - 1})")

    # -- chat -------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """Render `messages` with the GGUF's chat template (Jinja, as transformers does).

        add_generation_prompt (default True): end with the assistant turn's opening.
        tools (default None): tool JSON schemas for templates that support them.
        chat_template (default None): a named template of the GGUF (e.g. "tool_use") or a
        template source; None picks "tool_use" when tools are given and the GGUF has it, else
        `tokenizer.chat_template`. Other keyword arguments become template variables
        (they override bos_token/eos_token/... which are set from the vocabulary).
        """
        source = self._template_source(chat_template, tools)
        context = {**self._special_token_strings(), **kwargs}
        return render_chat(source, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           context=context)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None, chat_template: str | None = None,
                    **kwargs: Any) -> list[int]:
        """Token ids of the rendered chat, ready to feed the model (arguments as apply_chat_template).

        Control tokens in the rendering are parsed. As llama.cpp does, a BOS (EOS) the template
        already wrote is not added a second time: the rendered text loses a leading bos_token
        (trailing eos_token) when the vocabulary adds one itself.
        """
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                        chat_template=chat_template, **kwargs)
        ids = self._vocab.ids
        if self._vocab.add_bos and ids.bos is not None and text.startswith(self._vocab.tokens[ids.bos]):
            text = text[len(self._vocab.tokens[ids.bos]):]
        if self._vocab.add_eos and ids.eos is not None and text.endswith(self._vocab.tokens[ids.eos]):
            text = text[: len(text) - len(self._vocab.tokens[ids.eos])]
        return self.encode(text, add_special=True, parse_special=True)

    def _template_source(self, chat_template: str | None, tools: Any) -> str:
        templates = self._vocab.chat_templates
        if chat_template is not None:
            return templates.get(chat_template, chat_template)
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" not in templates:
            raise ChatTemplateError("this GGUF has no chat template ('tokenizer.chat_template' is not set); "
                                    "pass chat_template= with a template source")
        return templates["default"]

    def _special_token_strings(self) -> dict[str, str]:
        ids = self._vocab.ids
        named = {"bos_token": ids.bos, "eos_token": ids.eos, "unk_token": ids.unk, "pad_token": ids.pad,
                 "mask_token": ids.mask, "sep_token": ids.sep}
        return {name: self._vocab.tokens[i] for name, i in named.items() if i is not None}

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab})"
