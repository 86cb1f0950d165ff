"""Request parsing of the server (no HTTP, no model): defaults, OpenAI's spellings, our extensions,
and the refusals, each naming the field at fault."""
from __future__ import annotations

import pytest

from dspark_ggml.sampling import SamplingParams
from dspark_ggml.server.engines import SpecOverride
from dspark_ggml.server.errors import ApiError
from dspark_ggml.server.protocol import parse_chat, parse_completion, parse_detokenize, parse_tokenize

DEFAULTS = SamplingParams(max_tokens=100, temperature=0.0)


def test_defaults_fill_what_the_request_leaves_out():
    r = parse_completion({"prompt": "x", "temperature": None}, DEFAULTS, n_slots=4)
    assert (r.prompts, r.n, r.stream, r.include_usage, r.speculative) == (["x"], 1, False, False, None)
    assert r.sampling == DEFAULTS and r.sampling is not DEFAULTS


def test_sampling_fields_and_spellings():
    r = parse_completion({"prompt": [[1, 2, 3]], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                          "top_k": -1, "min_p": 0.1, "seed": 42, "stop": "\n", "stop_token_ids": [5],
                          "n": 2, "stream": True, "stream_options": {"include_usage": True}}, DEFAULTS, 4)
    s = r.sampling
    assert r.prompts == [[1, 2, 3]] and (r.n, r.stream, r.include_usage) == (2, True, True)
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (7, 0.5, 0.9, 0, 0.1, 42)
    assert (s.stop, s.stop_token_ids) == (["\n"], [5])
    chat = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]}],
                       "max_tokens": 3, "max_completion_tokens": 9}, DEFAULTS, 4)
    assert chat.messages == [{"role": "user", "content": "ab"}] and chat.sampling.max_tokens == 9


@pytest.mark.parametrize("value, expected", [
    (False, SpecOverride(off=True)), ({"enabled": False}, SpecOverride(off=True)), (True, None), ({}, None),
    ({"n_max": 3}, SpecOverride(n_max=3)), ({"p_min": 0.5}, SpecOverride(p_min=0.5)),
])
def test_speculative_override(value, expected):
    assert parse_completion({"prompt": "x", "speculative": value}, DEFAULTS, 4).speculative == expected


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "min_p": 2}, "min_p"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "seed": 2**32}, "seed"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 5}, "n"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"prompt": "x", "stream_options": "yes"}, "stream_options"),
    ({"prompt": "x", "speculative": {"n_max": 2, "depth": 3}}, "speculative"),
    ({"prompt": "x", "speculative": {"p_min": 1.5}}, "p_min"),
    ({"prompt": "x", "speculative": "off"}, "speculative"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "echo": True, "logprobs": 2, "stream": True}, "echo"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "repeat_penalty": 0}, "repeat_penalty"),
    ({"prompt": "x", "penalty_last_n": -2}, "penalty_last_n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"-1": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": "ban"}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5]}, "logit_bias"),
    ({"prompt": "x", "response_format": {"type": "yaml"}}, "response_format"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
     "response_format.json_schema.schema"),
    ({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"prompt": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", []]}, "prompt"),
    ({"prompt": ["a", [1, "b"]]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [True]}, "prompt"),
    ({"prompt": "x", "max_tokens": 2**31}, "max_tokens"),
    ({"prompt": "x", "top_k": 2**31}, "top_k"),
    ({"prompt": "x", "speculative": {"n_max": 2**31}}, "n_max"),
    ({"prompt": "x", "temperature": float("inf")}, "temperature"),
    ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
])
def test_bad_completion_fields(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, DEFAULTS, n_slots=4)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("messages, param", [
    (None, "messages"), ([], "messages"), ("hi", "messages"), ([["user", "hi"]], "messages[0]"),
    ([{"role": "user", "content": "x"}, {"role": "bot", "content": "x"}], "messages[1].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
     "messages[0].content"),
])
def test_bad_messages(messages, param):
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": messages}, DEFAULTS, n_slots=4)
    assert e.value.status == 400 and e.value.param == param


def test_not_an_object_and_the_token_endpoints():
    for body in ([], "x", 3, None):
        with pytest.raises(ApiError):
            parse_completion(body, DEFAULTS, 4)
    assert parse_tokenize({"content": "a"}) == ("a", False, True, False)
    assert parse_tokenize({"content": "a", "add_special": True, "parse_special": False}) == \
        ("a", True, False, False)
    assert parse_tokenize({"content": "a", "with_pieces": True}) == ("a", False, True, True)
    with pytest.raises(ApiError):
        parse_tokenize({"text": "a"})
    assert parse_detokenize({"tokens": []}, 10) == []
    with pytest.raises(ApiError):
        parse_detokenize({"tokens": [10]}, 10)


def test_several_prompts_and_ignore_eos():
    body = {"prompt": ["a", [1, 2], "b"], "n": 2, "ignore_eos": True}
    r = parse_completion(body, DEFAULTS, 4, max_sequences=6)
    assert r.prompts == ["a", [1, 2], "b"] and r.n_sequences == 6
    assert r.speculative == SpecOverride(ignore_eos=True)
    off = parse_completion({"prompt": "x", "speculative": False, "ignore_eos": True}, DEFAULTS, 4)
    assert off.speculative == SpecOverride(off=True, ignore_eos=True)
    with pytest.raises(ApiError) as e:  # more sequences than the server ever admits at once
        parse_completion({"prompt": ["a", "b", "c"], "n": 3}, DEFAULTS, 4, max_sequences=8)
    assert e.value.status == 400 and e.value.param == "prompt"


def test_usage_chunk_only_when_asked():
    stream = {"prompt": "x", "stream": True}
    assert not parse_completion(stream, DEFAULTS, 4).include_usage
    assert parse_completion({**stream, "stream_options": {"include_usage": True}}, DEFAULTS, 4).include_usage
    not_streamed = {"prompt": "x", "stream_options": {"include_usage": True}}
    assert not parse_completion(not_streamed, DEFAULTS, 4).include_usage


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("fields, param", [
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": 1}, "logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [TOOL], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_chat_fields(fields, param):
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": HI, **fields}, DEFAULTS, n_slots=4)
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_chat_fields_reach_the_sampling_params():
    req = parse_chat({"messages": HI, "logprobs": True, "top_logprobs": 3,
                      "logit_bias": {"7": -100, "9": 2.5},
                      "presence_penalty": 0.5, "frequency_penalty": -0.25, "repeat_penalty": 1.3,
                      "penalty_last_n": -1, "response_format": {"type": "json_object"}}, DEFAULTS, 4)
    s = req.sampling
    assert (s.logprobs, s.prompt_logprobs, s.logit_bias) == (3, None, {7: -100.0, 9: 2.5})
    penalties = (s.presence_penalty, s.frequency_penalty, s.repeat_penalty, s.penalty_last_n)
    assert penalties == (0.5, -0.25, 1.3, -1)
    assert s.json_schema == {"type": "object"} and s.grammar is None
    forced = parse_chat({"messages": HI, "tools": [TOOL],
                         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                        DEFAULTS, 4)
    assert forced.tools.forced == "get_weather" and forced.sampling.grammar
    auto = parse_chat({"messages": HI, "tools": [TOOL]}, DEFAULTS, 4)
    assert auto.tools.mode == "auto" and auto.sampling.grammar is None
    assert parse_chat({"messages": HI, "tools": [TOOL], "tool_choice": "none"}, DEFAULTS, 4).tools is None
    echo = parse_completion({"prompt": "x", "logprobs": 2, "echo": True}, DEFAULTS, 4)
    assert echo.echo and (echo.sampling.logprobs, echo.sampling.prompt_logprobs) == (2, 2)


def test_a_request_s_constraint_replaces_the_server_s_default_one():
    pytest.importorskip("llguidance")
    from dspark_ggml.structured import gbnf_grammar

    served = SamplingParams(max_tokens=100, grammar=gbnf_grammar('root ::= "a"'))
    msgs = {"messages": [{"role": "user", "content": "x"}]}
    assert parse_chat(msgs, served, 4).sampling.grammar == served.grammar  # the default stays
    asked = parse_chat({**msgs, "response_format": {"type": "json_object"}}, served, 4).sampling
    assert (asked.json_schema, asked.grammar) == ({"type": "object"}, None)
    asked = parse_chat({**msgs, "json_schema": {}}, served, 4).sampling
    assert (asked.json_schema, asked.grammar) == ({"type": "object"}, None)
    asked = parse_completion({"prompt": "x", "grammar": 'root ::= "b"'}, DEFAULTS, 4).sampling
    assert asked.grammar == gbnf_grammar('root ::= "b"') != served.grammar and asked.json_schema is None


def test_a_responses_request_becomes_the_chat_request_it_runs_as():
    pytest.importorskip("llguidance")
    from dspark_ggml.server.protocol import parse_responses

    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = {"instructions": "Be brief.", "max_output_tokens": 9, "parallel_tool_calls": False, "top_logprobs": 2,
            "tools": [{"type": "function", "name": "weather", "description": "d", "parameters": params}],
            "tool_choice": {"type": "function", "name": "weather"},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
                      {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
                      {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Lyon"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                      {"type": "function_call_output", "call_id": "c2", "output": "rain"}]}
    r = parse_responses(body, DEFAULTS, 4)
    chat = r.chat
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "tool", "tool"]
    calls = chat.messages[2]["tool_calls"]  # consecutive calls: one assistant message (arguments
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [("c1", {"city": "Paris"}),  # parsed for
                                                                      ("c2", {"city": "Lyon"})]   # the template)
    assert chat.messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert chat.tools.names == ["weather"] and chat.tools.forced == "weather" and not chat.tools.parallel
    assert chat.sampling.max_tokens == 9 and chat.sampling.logprobs == 2 and chat.sampling.grammar is not None
    assert r.echo["tool_choice"] == body["tool_choice"] and r.echo["top_logprobs"] == 2
    fmt = {"type": "json_schema", "name": "city", "schema": params, "strict": True}
    schema = parse_responses({"input": "x", "text": {"format": fmt}}, DEFAULTS, 4).chat.sampling.json_schema
    assert schema == params
    assert parse_responses({"input": "x", "include": ["message.output_text.logprobs"]}, DEFAULTS, 4).chat.sampling.logprobs == 0
    assert parse_responses({"input": "x"}, DEFAULTS, 4).chat.sampling.logprobs is None
