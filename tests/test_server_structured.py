"""Structured output through a real `dspark-ggml serve` of the demo pair (SmolLM2-135M-Instruct and its
DSpark draft: a model that follows instructions), with the official `openai` client and raw HTTP:
``response_format`` json_schema gives schema-valid JSON in 50 of 50 requests (checked by
jsonschema, not by the grammar engine), the same greedy output with the draft on and off;
``json_object``; ``tools`` with ``tool_choice`` required / named / auto / none, parsed into
``tool_calls`` (whole and streamed); bad schemas and tool choices are 400s; ``SamplingParams(json_schema=)``
in the Python API."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

_, _, openai, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "openai", "httpx"))
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from dspark_ggml.errors import DSparkError  # noqa: E402
from server_process import ServerProcess, sse  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
NAMES = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Fatima", "Goran", "Hana", "Ivan", "Jun"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def demo_pair() -> tuple[str, str]:
    from dspark_ggml import demo
    try:
        return demo.target_path(quiet=True), demo.DRAFT_PATH
    except DSparkError as e:
        pytest.skip(f"the demo target is not available: {e}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    target, draft = demo_pair()
    srv = ServerProcess(["-m", target, "-md", draft, "-t", "2", "-np", "8", "--queue-size", "100",
                         "--spec-schedule", "static"], tmp_path_factory.mktemp("structured") / "server.log")
    yield srv
    assert srv.terminate() == 0, srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=300) as c:
        yield c


def person_prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Describe a person named {NAMES[i % len(NAMES)]} who is {20 + i} "
                                        f"years old and lives in {CITIES[i % len(CITIES)]}, as JSON."}]


def ask_person(oai, i: int, **kw):
    return oai.chat.completions.create(model="m", messages=person_prompt(i), max_tokens=48,
                                       response_format=FORMAT, **kw)


# ---- response_format ------------------------------------------------------------------------------

def test_fifty_of_fifty_constrained_answers_are_schema_valid(oai):
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda i: ask_person(oai, i), range(50)))
    valid = 0
    for r in answers:
        c = r.choices[0]
        assert c.finish_reason == "stop", c.message.content  # the grammar ended it, not max_tokens
        jsonschema.validate(json.loads(c.message.content), PERSON)
        valid += 1
    assert valid == 50
    assert sum(r.model_extra["speculative"]["accepted"] for r in answers) > 0  # the draft did help


def test_constrained_output_is_the_same_with_the_draft_off(oai):
    """Greedy and seeded sampled: the constraint masks the verify rows and cuts the drafts, so the
    output is the target-only one (all requests at once: they share the verify batches)."""
    off = {"extra_body": {"speculative": False}}
    seeded = {"temperature": 0.9, "seed": 21}
    calls = [(i, kw) for i in range(4) for kw in ({}, off)] + [(3, seeded), (3, {**seeded, **off})]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        texts = list(pool.map(lambda c: ask_person(oai, c[0], **c[1]).choices[0].message.content, calls))
    for on_text, off_text in zip(texts[::2], texts[1::2]):
        assert on_text == off_text
        jsonschema.validate(json.loads(on_text), PERSON)


def test_streamed_constrained_output(oai):
    text = "".join(c.choices[0].delta.content or "" for c in
                   ask_person(oai, 7, stream=True) if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_and_completions(oai, http):
    def ask(i: int):
        return oai.chat.completions.create(model="m", messages=person_prompt(i), max_tokens=48,
                                           response_format={"type": "json_object"})

    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(ask, range(3)))
    for r in answers:
        c = r.choices[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert c.message.content.lstrip().startswith("{")
    r = http.post("/v1/completions",
                  json={"prompt": "A person as JSON:", "max_tokens": 48, "response_format": FORMAT})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), PERSON)


# ---- llama-server's fields: grammar (GBNF), json_schema, json_object with a schema -----------------

YES_NO = 'root ::= answer "."\nanswer ::= "yes" | "no"'


def test_llama_server_grammar_and_json_schema_fields(http):
    for path, body in (("/v1/completions", {"prompt": "Is Paris in France? Answer yes or no:"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Is Paris in France?"}]})):
        r = http.post(path, json={**body, "max_tokens": 8, "grammar": YES_NO})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        assert (c.get("text") or c["message"]["content"]) in ("yes.", "no.")
        r = http.post(path, json={**body, "max_tokens": 48, "json_schema": PERSON})
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        jsonschema.validate(json.loads(c.get("text") or c["message"]["content"]), PERSON)
    r = http.post("/v1/chat/completions", json={"messages": person_prompt(1), "max_tokens": 48,
                                                "response_format": {"type": "json_object", "schema": PERSON}})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), PERSON)


@pytest.mark.parametrize("extra, param, words", [
    ({"grammar": YES_NO, "json_schema": PERSON}, "grammar", "cannot both"),
    ({"grammar": YES_NO, "response_format": FORMAT}, "grammar", "cannot both"),
    ({"grammar": "root ::= (", }, "grammar", "invalid GBNF grammar"),
    ({"grammar": 7}, "grammar", "must be a string"),
    ({"json_schema": [1, 2]}, "json_schema", "must be a JSON schema object"),
    ({"response_format": {"type": "json_object", "schema": "x"}}, "response_format.schema", "JSON schema object"),
    ({"grammar": YES_NO, "tools": [WEATHER], "tool_choice": "required"}, "grammar", "tool call"),
])
def test_bad_or_clashing_constraints_are_400s_naming_the_field(http, extra, param, words):
    r = http.post("/v1/chat/completions", json={"messages": person_prompt(0), "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


# ---- tools ---------------------------------------------------------------------------------------

WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def check_weather_call(call) -> None:
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tool_calls_are_parsed(oai, choice):
    r = oai.chat.completions.create(model="m", messages=WEATHER_Q, max_tokens=64, tools=[WEATHER, TIME],
                                    tool_choice=choice, parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c.message
    call = c.message.tool_calls[0]
    if isinstance(choice, dict):
        check_weather_call(call)
    else:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)


def test_streamed_tool_calls(oai):
    calls, finish = [], None
    for chunk in oai.chat.completions.create(model="m", messages=WEATHER_Q, max_tokens=64, tools=[WEATHER],
                                             tool_choice="required", parallel_tool_calls=False, stream=True):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 1
    check_weather_call(calls[0])


def test_auto_and_none_and_a_tool_result_turn(oai):
    history = WEATHER_Q + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'}]
    asks = [{"messages": WEATHER_Q, "max_tokens": 32},
            {"messages": WEATHER_Q, "max_tokens": 16, "tool_choice": "none"},
            {"messages": history, "max_tokens": 16}]
    with ThreadPoolExecutor(max_workers=3) as pool:
        auto, none, after = pool.map(
            lambda kw: oai.chat.completions.create(model="m", tools=[WEATHER], **kw), asks)
    c = auto.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.message.tool_calls:
        check_weather_call(c.message.tool_calls[0])
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content
    assert after.choices[0].message.content


# ---- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
      "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
])
def test_bad_formats_and_tools_are_400_and_the_server_goes_on(http, fields, param):
    r = http.post("/v1/chat/completions", json={"messages": WEATHER_Q, "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]
    ok = http.post("/v1/chat/completions", json={"messages": WEATHER_Q, "max_tokens": 2})
    assert ok.status_code == 200


# ---- the Python API --------------------------------------------------------------------------------

def test_llm_generate_with_a_json_schema():
    from dspark_ggml import LLM, SamplingParams

    target, draft = demo_pair()
    with LLM(target, draft_model_path=draft, n_threads=2) as llm:
        prompt = llm.apply_chat_template(person_prompt(1))
        r = llm.generate(prompt, SamplingParams(max_tokens=48, json_schema=PERSON))
        assert r.finish_reason == "stop"
        jsonschema.validate(json.loads(r.text), PERSON)
        obj = llm.generate(prompt, max_tokens=48, json_schema=json.dumps({"type": "object"}))
        assert obj.finish_reason != "stop" or isinstance(json.loads(obj.text), dict)


def test_streamed_auto_tools_give_the_whole_answer(oai):
    """tool_choice auto, streamed: text before any call streams as it comes, and the joined stream
    is the whole (non-streamed) answer: the same text and the same calls."""
    kw = {"model": "m", "messages": WEATHER_Q, "max_tokens": 40, "tools": [WEATHER, TIME]}
    whole = oai.chat.completions.create(**kw).choices[0]
    text, calls, finish = [], [], None
    for chunk in oai.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text.append(c.delta.content or "")
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == whole.finish_reason
    assert "".join(text).strip() == (whole.message.content or "").strip()
    assert [c.function.name for c in calls] == [c.function.name for c in whole.message.tool_calls or []]


# ---- the Responses API: function tools, text.format, logprobs ------------------------------------

R_WEATHER = {"type": "function", "name": "get_weather", "description": WEATHER["function"]["description"],
             "parameters": WEATHER["function"]["parameters"]}
WEATHER_ARGS = WEATHER["function"]["parameters"]


def test_responses_function_calls_and_the_turn_after_them(oai):
    r = oai.responses.create(model="m", input=WEATHER_Q, tools=[R_WEATHER], tool_choice="required",
                             parallel_tool_calls=False, max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"
    after = oai.responses.create(model="m", tools=[R_WEATHER], tool_choice="none", max_output_tokens=16, input=[
        *WEATHER_Q, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21, "sky": "clear"}'}])
    assert [o.type for o in after.output] == ["message"] and after.output_text


def test_responses_streamed_function_call(oai):
    events = list(oai.responses.create(model="m", input=WEATHER_Q, tools=[R_WEATHER], max_output_tokens=64,
                                       tool_choice={"type": "function", "name": "get_weather"},
                                       parallel_tool_calls=False, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert "response.output_text.delta" not in types  # no text around a forced call: no message item
    assert types[-5:] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"], types
    done = events[-2].item
    assert done.type == "function_call" and events[-3].arguments == done.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_ARGS)
    final = [o for o in events[-1].response.output if o.type == "function_call"]
    assert [(o.id, o.call_id, o.arguments) for o in final] == [(done.id, done.call_id, done.arguments)]


def test_responses_text_format_and_logprobs(oai, http):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = oai.responses.create(model="m", input=person_prompt(2), text={"format": fmt}, max_output_tokens=48)
    jsonschema.validate(json.loads(r.output_text), PERSON)
    body = {"input": "Say hi.", "max_output_tokens": 6, "top_logprobs": 3}
    part = http.post("/v1/responses", json=body).json()["output"][0]["content"][0]
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say hi."}],
                                                   "max_tokens": 6, "logprobs": True, "top_logprobs": 3}).json()
    assert part["logprobs"] == chat["choices"][0]["logprobs"]["content"] and len(part["logprobs"]) >= 5
    assert "".join(e["token"] for e in part["logprobs"]) == part["text"]
    assert all(len(e["top_logprobs"]) == 3 for e in part["logprobs"])
    streamed = sse(http, "/v1/responses", {**body, "stream": True})
    deltas = [d for name, d in streamed if name == "response.output_text.delta"]
    assert [e for d in deltas for e in d["logprobs"]] == part["logprobs"]
