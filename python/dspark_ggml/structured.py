"""Structured output: a grammar (JSON schema, any JSON object, Lark) as the engine's token constraint.

The grammar engine is llguidance (PyPI). :class:`GrammarConstraint` implements the engine's
constraint callback (``TokenConstraint``): before each verify it fills the allowed-token masks of
the committed state and of the state after each drafted token, and it advances only when the
engine commits tokens. A drafted token the grammar rejects ends the masks there, so the engine
never verifies it. The masks are llguidance's own bit layout (bit t % 32 of 32-bit word t // 32),
which is the engine's.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class TokenConstraint(Protocol):
    """What ``Engine.add(..., constraint=)`` takes (see csrc/include/dspark.h, struct dspark_constraint)."""

    n_vocab: int

    def fill_masks(self, tokens: Sequence[int], out: np.ndarray) -> int:
        """Rows 0..len(tokens) of ``out`` (uint32 [len(tokens) + 1, n_words]): row i = the tokens
        allowed after the committed ones plus tokens[:i]. Row i + 1 only if tokens[i] is allowed
        by row i. Returns the rows filled."""

    def commit(self, tokens: Sequence[int]) -> None:
        """The engine committed ``tokens`` (in order)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:  # a dependency, but say what is missing if it was left out
        raise InvalidArgumentError("structured output needs the llguidance package "
                                   "(pip install llguidance)") from e
    return llguidance


# ---- the grammar engine's view of our tokenizer --------------------------------------------------

_LL_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


class _TokenizerView:
    """What llguidance's TokenizerWrapper reads: every token's bytes (control tokens marked with a
    leading 0xff byte, which llguidance reads as "special": never produced by grammar text), the
    special ids, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        from .tokenizer.vocab import TokenType

        special = [i for i in range(tokenizer.n_vocab) if tokenizer.token_type(i) == TokenType.CONTROL]
        marked = set(special)
        self.tokens = [(b"\xff" if i in marked else b"") + tokenizer.token_to_piece(i, special=True)
                       for i in range(tokenizer.n_vocab)]
        self.tokens += [b""] * (n_vocab - len(self.tokens))  # a model's padded vocabulary rows
        self.special_token_ids = special
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        s = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        return self._tokenizer.encode(s, add_special=False)


def ll_tokenizer(tokenizer: Tokenizer, n_vocab: int | None = None) -> Any:
    """llguidance's LLTokenizer for ``tokenizer`` (built once per tokenizer: ~0.1 s for 50k tokens);
    the end-of-generation tokens are the grammar's end; ``n_vocab``: the model's (>= the tokenizer's)."""
    llg = _llguidance()
    n = max(n_vocab or 0, tokenizer.n_vocab)
    with _LL_LOCK:
        cached = _LL_TOKENIZERS.get(tokenizer)
        if cached is None or cached.vocab_size != n:
            eog = sorted(tokenizer.eog_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
            if not eog:
                raise InvalidArgumentError("structured output needs an end-of-generation token and this "
                                           "tokenizer has none")
            cached = llg.LLTokenizer(llg.TokenizerWrapper(_TokenizerView(tokenizer, n)), n_vocab=n,
                                     eos_token=eog)
            _LL_TOKENIZERS[tokenizer] = cached
        return cached


# ---- grammars ------------------------------------------------------------------------------------

# JSON as OpenAI's structured outputs write it: no whitespace choice left to the model, so a small
# model cannot wander into endless spaces and newlines
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_schema_grammar(schema: dict | str | bool) -> str:
    """The grammar of JSON documents valid under ``schema`` (a dict, its JSON text, or True).

    Raises:
        InvalidArgumentError: ``schema`` is not a JSON object (or is not JSON).
    """
    llg = _llguidance()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise InvalidArgumentError(f"the JSON schema is not valid JSON: {e}") from e
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidArgumentError("a JSON schema must be a JSON object")
    try:
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except ValueError as e:
        raise InvalidArgumentError(f"invalid JSON schema: {e}") from e


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's response_format json_object)."""
    return json_schema_grammar({"type": "object"})


def lark_grammar(lark: str) -> str:
    """A Lark grammar (llguidance's dialect: ``%json {schema}`` embeds a JSON schema)."""
    return _llguidance().LLMatcher.grammar_from_lark(lark)


def gbnf_grammar(gbnf: str) -> str:
    """A GBNF grammar (llama.cpp's format: ``root ::= ...``), as llama-server's and llama-cli's
    ``grammar`` take it.

    Raises:
        InvalidArgumentError: the text is not GBNF the converter understands (the message says where).
    """
    try:
        return _llguidance().grammar_from("gbnf", gbnf)
    except ValueError as e:
        raise InvalidArgumentError(f"invalid GBNF grammar: {e}") from e


def check_grammar(grammar: str, tokenizer: Any = None) -> None:
    """Raise InvalidArgumentError naming what is wrong with a grammar (bad schema, bad Lark)."""
    error = _llguidance().LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise InvalidArgumentError(f"invalid grammar: {error}")


# ---- the constraint ------------------------------------------------------------------------------

class GrammarConstraint:
    """A grammar as the engine's constraint for one sequence (a :class:`TokenConstraint`).

    Args:
        tokenizer: the model's Tokenizer.
        grammar: a grammar from :func:`json_schema_grammar`, :func:`json_object_grammar`, ...
        n_vocab: the target model's vocabulary size (the masks' width); default the tokenizer's.

    Raises:
        InvalidArgumentError: the grammar does not compile (its message says why).
    """

    def __init__(self, tokenizer: Tokenizer, grammar: str, n_vocab: int | None = None) -> None:
        llg = _llguidance()
        self._ll = ll_tokenizer(tokenizer, n_vocab)
        self.n_vocab = self._ll.vocab_size
        self.n_words = (self.n_vocab + 31) // 32
        self._eog = frozenset(self._ll.eos_tokens)
        self._matcher = llg.LLMatcher(self._ll, grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidArgumentError(f"invalid grammar: {self._matcher.get_error()}")
        self.seconds = 0.0  # time spent in fill_masks and commit (the constraint's cost per token)

    @classmethod
    def from_json_schema(cls, tokenizer: Tokenizer, schema: dict | str | bool,
                         n_vocab: int | None = None) -> GrammarConstraint:
        return cls(tokenizer, json_schema_grammar(schema), n_vocab)

    @property
    def error(self) -> str:
        """Why the matcher stopped accepting tokens ("" while it is fine)."""
        return self._matcher.get_error()

    @property
    def accepting(self) -> bool:
        """Whether the tokens committed so far form a complete document of the grammar."""
        return self._matcher.is_accepting()

    def fill_masks(self, tokens: Sequence[int], out: np.ndarray) -> int:
        """See :class:`TokenConstraint`. The matcher ends where it started: the tokens it consumes
        to reach the later rows are rolled back."""
        if out.dtype != np.uint32 or out.ndim != 2 or out.shape[1] != self.n_words or \
                out.shape[0] < len(tokens) + 1 or not out.flags["C_CONTIGUOUS"]:
            raise ValueError(f"masks must be contiguous uint32 [{len(tokens) + 1}, {self.n_words}]")
        m = self._matcher
        t0 = time.perf_counter()
        self._fill_row(out, 0)
        consumed = 0
        try:
            for i, token in enumerate(tokens):
                # an end-of-generation token ends the masks too: nothing is sampled after it, and
                # the target picks it again from row i if the grammar allows it there
                if token in self._eog or not _allowed(out[i], token) or not m.consume_token(int(token)):
                    break
                consumed += 1
                self._fill_row(out, i + 1)
        finally:
            if consumed:
                m.rollback(consumed)
            self.seconds += time.perf_counter() - t0
        return consumed + 1

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance over committed tokens. Raises RuntimeError if the grammar rejects one (the engine
        only commits tokens its masks allowed, so that is a bug)."""
        m = self._matcher
        t0 = time.perf_counter()
        try:
            for t in tokens:
                if t in self._eog and (m.is_stopped() or m.is_accepting()):
                    return  # the end of a complete document: the sequence ends with it (a stopped
                    # matcher refuses even the end token)
                if not m.consume_token(int(t)):
                    raise RuntimeError(f"the grammar rejected committed token {t} (of {list(tokens)}): "
                                       f"{self.error}")
        finally:
            self.seconds += time.perf_counter() - t0

    def _fill_row(self, out: np.ndarray, i: int) -> None:
        row = out[i]
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self._matcher.is_error():
            raise RuntimeError(f"the grammar failed: {self.error}")


def _allowed(row: np.ndarray, token: int) -> bool:
    return 0 <= token < row.shape[0] * 32 and bool((int(row[token >> 5]) >> (token & 31)) & 1)


def constraint_for(tokenizer: Tokenizer | None, sampling: Any,
                   n_vocab: int | None = None) -> GrammarConstraint | None:
    """The constraint a SamplingParams asks for (``json_schema`` or ``grammar``; one sequence's
    own: it keeps the state of that sequence), or None.

    Raises:
        InvalidArgumentError: no tokenizer to build it with, or a schema / grammar that does not compile.
    """
    schema, grammar = getattr(sampling, "json_schema", None), getattr(sampling, "grammar", None)
    if schema is None and grammar is None:
        return None
    if tokenizer is None:
        raise InvalidArgumentError("structured output (json_schema, grammar) needs a tokenizer and this "
                                   "model has none")
    return GrammarConstraint(tokenizer, json_schema_grammar(schema) if schema is not None else grammar,
                             n_vocab)
