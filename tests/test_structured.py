"""The grammar constraint (dspark_ggml.structured) on its own: masks of the committed state and of each
drafted token, rollback, commits; random walks through the masks give documents that json.loads and
jsonschema (independent of llguidance) accept; the tool-call grammar and parser of the server."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("llguidance")

from dspark_ggml.errors import InvalidArgumentError  # noqa: E402
from dspark_ggml.structured import GrammarConstraint, gbnf_grammar, json_object_grammar, json_schema_grammar  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402

from tests.tiny_pair import TARGET_PATH  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                    "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(TARGET_PATH)


def allowed(row: np.ndarray, n_vocab: int) -> set[int]:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:n_vocab]
    return set(np.flatnonzero(bits).tolist())


def masks(c: GrammarConstraint, tokens: list[int]) -> tuple[int, np.ndarray]:
    out = np.zeros((len(tokens) + 1, c.n_words), np.uint32)
    return c.fill_masks(tokens, out), out


def test_rows_are_the_states_after_each_draft_token_and_nothing_advances(tok):
    text = '{"name": "Bo", "age": 42}'
    ids = tok.encode(text, add_special=False)
    c = GrammarConstraint.from_json_schema(tok, SCHEMA)
    n, rows = masks(c, ids)
    assert n == len(ids) + 1  # a valid document: every token allowed, a row after each
    for i, t in enumerate(ids):
        assert t in allowed(rows[i], c.n_vocab)
        fresh = GrammarConstraint.from_json_schema(tok, SCHEMA)
        fresh.commit(ids[:i])
        _, ref = masks(fresh, [])
        assert np.array_equal(ref[0], rows[i])  # row i = the state after the first i tokens
    assert allowed(rows[-1], c.n_vocab) == set(tok.eog_ids)  # complete: only the end
    # fill_masks left the matcher where it was: the first row again
    _, again = masks(c, [])
    assert np.array_equal(again[0], rows[0])


def test_a_rejected_draft_token_ends_the_rows(tok):
    ids = tok.encode('{"name": "Bo", "age": 42}', add_special=False)
    bad = tok.encode("x", add_special=False)[0]
    c = GrammarConstraint.from_json_schema(tok, SCHEMA)
    assert bad not in allowed(masks(c, [])[1][0], c.n_vocab)
    n, _ = masks(c, ids[:3] + [bad] + ids[3:])
    assert n == 4  # rows 0..3: the draft is cut before the rejected token
    c.commit(ids[:3])
    n, _ = masks(c, ids[3:])
    assert n == len(ids) - 3 + 1
    with pytest.raises(RuntimeError):
        c.commit([bad])  # the engine never commits what a mask refused


def test_an_end_token_in_the_draft_ends_the_rows(tok):
    ids = tok.encode('{"name": "Bo", "age": 4}', add_special=False)
    eog = min(tok.eog_ids)
    c = GrammarConstraint.from_json_schema(tok, SCHEMA)
    n, rows = masks(c, ids + [eog])
    assert n == len(ids) + 1 and eog in allowed(rows[len(ids)], c.n_vocab)


def random_walk(tok, c: GrammarConstraint, rng: random.Random, steps: int) -> str | None:
    """The text of a random walk through the constraint's masks until it takes an end token
    (preferred when allowed, so that walks stay short); None if it took more than ``steps``."""
    out: list[int] = []
    for _ in range(steps):
        choices = sorted(allowed(masks(c, [])[1][0], c.n_vocab))
        end = [t for t in choices if t in tok.eog_ids]
        t = end[0] if end and rng.random() < 0.5 else rng.choice(choices)
        if t in tok.eog_ids:
            return tok.decode(out)
        c.commit([t])
        out.append(t)
    return None


@pytest.mark.parametrize("grammar", ["schema", "object"])
def test_random_walks_give_valid_documents(tok, grammar):
    jsonschema = pytest.importorskip("jsonschema")
    rng = random.Random(7)
    n_checked = 0
    for _ in range(20):
        g = json_schema_grammar(SCHEMA) if grammar == "schema" else json_object_grammar()
        text = random_walk(tok, GrammarConstraint(tok, g), rng, 400)
        if text is None:
            continue  # too long a walk (a long string): nothing to check
        doc = json.loads(text)
        if grammar == "schema":
            jsonschema.validate(doc, SCHEMA)
        else:
            assert isinstance(doc, dict)
        n_checked += 1
    assert n_checked >= 10


def test_bad_schemas_are_refused_with_the_reason(tok):
    with pytest.raises(InvalidArgumentError, match="foo"):
        GrammarConstraint.from_json_schema(tok, {"type": "foo"})
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        GrammarConstraint.from_json_schema(tok, "{nope")
    with pytest.raises(InvalidArgumentError, match="JSON object"):
        GrammarConstraint.from_json_schema(tok, [1, 2])


GBNF_LIST = """root ::= "[" item ("," item)* "]"
item ::= [a-c] [0-9]"""


def test_gbnf_grammars_random_walks_match_the_language(tok):
    """A grammar in llama.cpp's GBNF: every random walk through its masks spells a word of its
    language, checked by a regular expression written here (not by the grammar engine)."""
    import re

    rng = random.Random(3)
    walks = 0
    for _ in range(20):
        text = random_walk(tok, GrammarConstraint(tok, gbnf_grammar(GBNF_LIST)), rng, 200)
        if text is None:
            continue
        assert re.fullmatch(r"\[[a-c][0-9](,[a-c][0-9])*\]", text), text
        walks += 1
    assert walks >= 10


def test_bad_gbnf_is_refused_with_where(tok):
    with pytest.raises(InvalidArgumentError, match="invalid GBNF grammar.*line 1"):
        gbnf_grammar('root ::= ("a"')
    with pytest.raises(InvalidArgumentError, match="invalid GBNF grammar"):
        gbnf_grammar("item ::= [a-c]")  # no root rule


def test_masks_have_the_models_width(tok):
    c = GrammarConstraint.from_json_schema(tok, SCHEMA, n_vocab=tok.n_vocab + 100)
    assert c.n_vocab == tok.n_vocab + 100 and c.n_words == (tok.n_vocab + 100 + 31) // 32
    with pytest.raises(ValueError):
        c.fill_masks([], np.zeros((1, c.n_words - 1), np.uint32))


# ---- the server's tool calls ---------------------------------------------------------------------

def test_tool_grammar_takes_only_the_forced_call_and_the_parser_reads_it(tok):
    from dspark_ggml.server.tools import call_grammar, parse_calls, parse_tools
    from dspark_ggml.structured import lark_grammar

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    time_fn = {"type": "function", "function": {"name": "get_time"}}
    choice = parse_tools({"tools": [weather, time_fn],
                          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    c = GrammarConstraint(tok, lark_grammar(call_grammar(choice)))
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    ids = tok.encode(good, add_special=False)
    assert masks(c, ids)[0] == len(ids) + 1
    bad_ids = tok.encode(other, add_special=False)
    assert masks(c, bad_ids)[0] < len(bad_ids) + 1
    parsed = parse_calls("Sure. " + good, choice)
    assert parsed.content == "Sure." and len(parsed.calls) == 1
    fn = parsed.calls[0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == {"city": "Paris"}
    assert parse_calls("<tool_call>\n{broken\n</tool_call>", choice).calls == []
    assert parse_calls('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', choice).calls == []


def test_the_end_token_after_a_complete_document_commits(tok):
    ids = tok.encode('{"name": "Bo", "age": 4}', add_special=False)
    c = GrammarConstraint.from_json_schema(tok, SCHEMA)
    for t in ids:
        c.commit([t])
    assert c.accepting
    c.commit([min(tok.eog_ids)])  # what the engine commits last


def test_tools_go_into_the_system_prompt_and_earlier_calls_into_the_text():
    from dspark_ggml.server.tools import parse_tools, template_takes_tools, with_tools

    choice = parse_tools({"tools": [{"type": "function", "function": {"name": "get_time"}}]})
    call = {"type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}
    msgs = with_tools([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "time?"},
                       {"role": "assistant", "content": "", "tool_calls": [call]},
                       {"role": "tool", "content": "12:00"}], choice)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[0]["content"].startswith("Be brief.\n\n") and '"name": "get_time"' in msgs[0]["content"]
    assert json.loads(msgs[2]["content"].split("<tool_call>\n")[1].split("\n</tool_call>")[0]) == \
        {"name": "get_time", "arguments": {"zone": "UTC"}}
    assert msgs[3]["content"] == "<tool_response>\n12:00\n</tool_response>"
    assert "tool_calls" not in msgs[2]
    assert with_tools([{"role": "user", "content": "x"}], choice)[0]["role"] == "system"
    assert template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_takes_tools("{{ messages[0]['content'] }}") and not template_takes_tools(None)


def test_streamed_text_stops_where_a_tool_call_may_start():
    from dspark_ggml.server.tools import streamable

    assert streamable("Hello there") == len("Hello there")
    assert streamable("Sure <tool") == len("Sure ")  # may become a call: held back
    assert streamable("Sure <tool_call>\n{") == len("Sure ")
    assert streamable("a < b") == len("a < b")
