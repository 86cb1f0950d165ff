"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) against real server processes
(the tiny pair with its draft and an API key; the target alone), driven by the official `anthropic`
client and raw HTTP: greedy text equal to the target decoding alone (speculation on and off),
multi-turn with a system prompt, stop sequences, the stream's event sequence, tool_use and
tool_result blocks under the tool-call grammar, token counting, the error shape, and bad requests
answered 400 with the server still serving."""
from __future__ import annotations

import json

import pytest

_, _, anthropic, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "anthropic", "httpx"))

from dspark_ggml import LLM  # noqa: E402
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import FA_ARGS, SERVER_FA, http_clients, running_servers, sse  # noqa: E402

KEY = "messages-test-key-0123456789"
COMMON = ["-t", "1", "-np", "2", *FA_ARGS]
KINDS = ["draft", "plain"]
SYSTEM = "You write Python."
TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f():"},
         {"role": "user", "content": [{"type": "text", "text": "more"}]}]
AS_CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"},
           {"role": "assistant", "content": "def f():"}, {"role": "user", "content": "more"}]
WEATHER = {"name": "get_weather", "description": "The weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    pair = ["-m", TARGET_PATH, "-md", DRAFT_PATH, "--spec-schedule", "static", *COMMON]
    yield from running_servers({"draft": (pair, KEY), "plain": (["-m", TARGET_PATH, *COMMON], None)},
                               tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def http(servers):
    yield from http_clients(servers)


@pytest.fixture(scope="module")
def client(servers):
    return {name: anthropic.Anthropic(base_url=srv.url, api_key=srv.api_key or "unused", max_retries=0,
                                      timeout=60) for name, srv in servers.items()}


@pytest.fixture(scope="module")
def reference():
    with LLM(TARGET_PATH, n_threads=1, flash_attn=SERVER_FA, batch_invariant=True) as llm:
        yield llm


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_message_is_the_targets_own(client, reference, kind):
    r = client[kind].messages.create(model="m", max_tokens=12, system=SYSTEM, messages=TURNS,
                                     extra_body={"temperature": 0})
    want = reference.chat(AS_CHAT, max_tokens=12)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want.text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    # Anthropic's usage: input_tokens are those not read from the (prompt) cache
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == len(want.prompt_tokens)
    assert r.usage.output_tokens == 12


@pytest.mark.parametrize("kind", KINDS)
def test_stop_sequences(client, reference, kind):
    r = client[kind].messages.create(model="m", max_tokens=64, messages=TURNS[:1], stop_sequences=["\n"])
    want = reference.chat(TURNS[:1], max_tokens=64, stop=["\n"])
    assert "\n" not in want.text and want.finish_reason == "stop"  # the case: a stop sequence ended it
    assert r.content[0].text == want.text
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", "\n")


@pytest.mark.parametrize("kind", KINDS)
def test_stream_sends_anthropics_events(client, http, reference, kind):
    raw = sse(http[kind], "/v1/messages", {"max_tokens": 9, "messages": TURNS[:1], "stream": True})
    names = [name for name, _ in raw]
    assert all(name == data["type"] for name, data in raw)  # "event: <type>" with each
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    start = raw[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    text = "".join(d["delta"]["text"] for n, d in raw if n == "content_block_delta")
    want = reference.chat(TURNS[:1], max_tokens=9)
    assert text == want.text
    assert raw[-2][1]["delta"]["stop_reason"] == "max_tokens" and raw[-2][1]["usage"]["output_tokens"] == 9
    with client[kind].messages.stream(model="m", max_tokens=9, messages=TURNS[:1]) as s:
        final = s.get_final_message()
    assert final.content[0].text == text and final.stop_reason == "max_tokens"


@pytest.mark.parametrize("kind", KINDS)
def test_tool_use_then_tool_result(client, kind):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client[kind].messages.create(model="m", max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                                     messages=ask)
    calls = [b for b in r.content if b.type == "tool_use"]
    assert len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    assert isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("city"), str)
    # the same request streamed: the call arrives as input_json_delta and parses to the same input
    with client[kind].messages.stream(model="m", max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                                      messages=ask) as s:
        streamed = [b for b in s.get_final_message().content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(b.name, b.input) for b in calls]
    turns = ask + [{"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                                     for b in calls]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                                 "content": [{"type": "text", "text": "sunny"}]}]}]
    after = client[kind].messages.create(model="m", max_tokens=8, tools=[WEATHER], messages=turns)
    n_in = lambda u: u.input_tokens + u.cache_read_input_tokens  # noqa: E731
    assert after.type == "message" and n_in(after.usage) > n_in(r.usage)


def test_tool_result_goes_into_the_prompt_as_a_tool_message(client, http):
    """The turns count as many tokens as the same conversation sent to /v1/chat/completions."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    turns = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": [call]},
             {"role": "user",
              "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    as_chat = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
               {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    n = client["plain"].messages.count_tokens(model="m", messages=turns).input_tokens
    chat = http["plain"].post("/v1/chat/completions", json={"messages": as_chat, "max_tokens": 1})
    assert chat.status_code == 200, chat.text
    assert n == chat.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("kind", KINDS)
def test_count_tokens(client, reference, kind):
    got = client[kind].messages.count_tokens(model="m", system=SYSTEM, messages=TURNS)
    assert got.input_tokens == len(reference.chat(AS_CHAT, max_tokens=1).prompt_tokens)
    with_tools = client[kind].messages.count_tokens(model="m", messages=TURNS[:1], tools=[WEATHER])
    plain = client[kind].messages.count_tokens(model="m", messages=TURNS[:1])
    assert with_tools.input_tokens > plain.input_tokens  # the tools are in the prompt


def test_api_key_from_x_api_key(servers):
    good = anthropic.Anthropic(base_url=servers["draft"].url, api_key=KEY, max_retries=0, timeout=60)
    assert good.messages.count_tokens(model="m", messages=TURNS[:1]).input_tokens > 0
    bad = anthropic.Anthropic(base_url=servers["draft"].url, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="m", max_tokens=2, messages=TURNS[:1])


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, needle", [
    ({"messages": USER}, "max_tokens"),
    ({"max_tokens": 0, "messages": USER}, "max_tokens"),
    ({"max_tokens": 4}, "messages"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 4, "messages": USER + [{"role": "assistant", "content": "pre"}]}, "prefill"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}, "tool_use_id"),
    ({"max_tokens": 4, "messages": USER, "system": 5}, "system"),
    ({"max_tokens": 4, "messages": USER, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 4, "messages": USER, "tools": [{"name": "f"}]}, "tools[0]"),
    ({"max_tokens": 4, "messages": USER, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 4, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"max_tokens": 4, "messages": USER, "temperature": "hot"}, "temperature"),
])
def test_bad_messages_are_400_in_anthropics_shape(http, reference, body, needle):
    r = http["draft"].post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert needle in err["error"]["message"]
    ok = http["draft"].post("/v1/messages", json={"max_tokens": 4, "messages": USER}).json()
    assert ok["content"][0]["text"] == reference.chat(USER, max_tokens=4).text
