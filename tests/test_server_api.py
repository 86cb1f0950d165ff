"""The server's OpenAI surface beyond plain completions, against real server processes on loopback
(one with the demo draft, an API key and CORS; one target-only), driven by the official `openai`
client and raw HTTP (httpx): several prompts per request, system_fingerprint, the routes without
/v1, CORS, ignore_eos, n choices and their seeds, the usage chunk only when asked, /v1/embeddings,
/v1/responses, bad inputs (4xx, then the next request is served), a client gone mid-upload,
per-request speculative settings over time, and the metric names."""
from __future__ import annotations

import base64
import re
import socket
import time
from typing import Any

import numpy as np
import pytest

_, _, openai, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "openai", "httpx"))

from dspark_ggml import LLM  # noqa: E402
from dspark_ggml.context import Context  # noqa: E402
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import (FA_ARGS, HOST, SERVER_FA, http_clients, read_metrics, running_servers,  # noqa: E402
                            sse)

KEY = "api-test-key-0123456789"
ORIGIN = "http://allowed.example"
EMBD_CTX = 64
COMMON = ["-t", "1", "-np", "4", "--queue-size", "4", "--embeddings-ctx", str(EMBD_CTX),
          *FA_ARGS]
EOG_PROMPT = [314]  # a token whose greedy continuation on the demo target is <|im_end|> at once
PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n"]
FINGERPRINT = re.compile(r"dspark-ggml-\d+\.\d+\.\d+\S*-[0-9a-f]{12}")


# ---- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """"draft": the demo pair (static schedule: it drafts every step), an API key, CORS for ORIGIN;
    "plain": the target alone, no key, no CORS."""
    pair = ["-m", TARGET_PATH, "-md", DRAFT_PATH, "--spec-schedule", "static", "--cors-origins", ORIGIN, *COMMON]
    yield from running_servers({"draft": (pair, KEY), "plain": (["-m", str(TARGET_PATH), *COMMON], None)},
                               tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def http(servers):
    yield from http_clients(servers)


@pytest.fixture(scope="module")
def oai(servers):
    return {name: openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "unused", max_retries=0,
                                timeout=60) for name, srv in servers.items()}


@pytest.fixture(scope="module")
def reference():
    """Target-only decoding with the server's kernels: what greedy requests must return."""
    with LLM(TARGET_PATH, n_threads=1, flash_attn=SERVER_FA, batch_invariant=True) as llm:
        yield llm


KINDS = ["draft", "plain"]


def chunks_of(http, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = sse(http, path, {**body, "stream": True})
    assert events[-1][1] == "[DONE]"
    return [data for _, data in events[:-1]]




def assert_still_serving(http, reference) -> None:
    r = http.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 6})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference.generate(PROMPTS[1], max_tokens=6).text


# ---- several prompts, n choices, seeds ----------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_several_prompts_n_choices_each(http, reference, kind):
    prompts = [PROMPTS[0], reference.tokenize(PROMPTS[1]), EOG_PROMPT, PROMPTS[2]]
    body = {"prompt": prompts, "max_tokens": 8, "n": 2}
    r = http[kind].post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    want = [reference.generate(p, max_tokens=8) for p in prompts]
    assert [c["index"] for c in d["choices"]] == list(range(8))
    assert [c["text"] for c in d["choices"]] == [w.text for w in want for _ in range(2)]
    assert [c["finish_reason"] for c in d["choices"]] == [w.finish_reason for w in want for _ in range(2)]
    n_prompt = sum(len(w.prompt_tokens) for w in want)
    n_out = 2 * sum(len(w.tokens) for w in want)
    cached = d["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert d["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}
    assert 0 <= cached < n_prompt
    # streamed: the same texts, chunk by chunk, each tagged with its choice's index
    texts = [""] * 8
    for chunk in chunks_of(http[kind], "/v1/completions", body):
        for c in chunk["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == [c["text"] for c in d["choices"]]
    # 10 sequences > 4 slots + 4 queued: it could never run
    too_many = http[kind].post("/v1/completions", json={"prompt": ["a"] * 5, "n": 2})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("kind", KINDS)
def test_n_choices_sample_with_their_own_seeds(http, kind):
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 1.5}
    seeded = http[kind].post("/v1/completions", json={**body, "n": 3, "seed": 7}).json()["choices"]
    alone = [http[kind].post("/v1/completions", json={**body, "seed": 7 + j}).json()["choices"][0]["text"]
             for j in range(3)]
    assert [c["text"] for c in seeded] == alone  # choice j samples with seed + j
    assert len(set(alone)) > 1
    unseeded = http[kind].post("/v1/completions", json={**body, "n": 3}).json()["choices"]
    assert len({c["text"] for c in unseeded}) > 1  # each choice its own random seed
    greedy = http[kind].post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 8, "n": 3}).json()
    assert len({c["text"] for c in greedy["choices"]}) == 1


# ---- system_fingerprint, routes without /v1 -----------------------------------------------------

def test_system_fingerprint(http, oai):
    seen = {}
    for kind in KINDS:
        h = http[kind]
        whole = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()["system_fingerprint"]
        chat = oai[kind].chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "stream_options": {"include_usage": True}}
        chunks = chunks_of(h, "/v1/chat/completions", body)
        prints = {whole, chat.system_fingerprint, *(c["system_fingerprint"] for c in chunks)}
        assert len(prints) == 1, prints  # in every response and chunk, stable
        seen[kind] = prints.pop()
        assert FINGERPRINT.fullmatch(seen[kind]), seen[kind]
    assert seen["draft"] != seen["plain"]  # other model files


@pytest.mark.parametrize("kind", KINDS)
def test_routes_without_v1(servers, http, kind):
    h = http[kind]
    for path, body in (("completions", {"prompt": PROMPTS[0], "max_tokens": 5}),
                       ("chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 5}),
                       ("responses", {"input": "hi", "max_output_tokens": 5}),
                       ("embeddings", {"input": "hi"})):
        a, b = h.post("/v1/" + path, json=body), h.post("/" + path, json=body)
        assert a.status_code == b.status_code == 200, (path, a.text, b.text)
        strip = lambda d: {k: v for k, v in d.items()
                           if k not in ("id", "created", "created_at", "output", "timings")}
        da, db = a.json(), b.json()
        for d in (da, db):  # the second may find the first's prompt in the prompt cache
            for details in ("prompt_tokens_details", "input_tokens_details"):
                (d.get("usage") or {}).pop(details, None)
        assert strip(da) == strip(db)
    assert h.get("/models").json()["data"][0]["id"] == h.get("/v1/models").json()["data"][0]["id"]
    if servers[kind].api_key:
        assert httpx.post(servers[kind].url + "/completions", json={"prompt": "x"}).status_code == 401


# ---- CORS -----------------------------------------------------------------------------------------

def test_cors(servers, http):
    url = servers["draft"].url
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(url + "/v1/chat/completions", headers=preflight)  # no API key
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in r.headers
    evil = httpx.options(url + "/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"})
    assert evil.status_code == 400 and "access-control-allow-origin" not in evil.headers
    body = {"prompt": "x", "max_tokens": 2}
    ok = http["draft"].post("/v1/completions", json=body, headers={"Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-credentials" not in ok.headers
    denied = httpx.post(url + "/v1/completions", json={"prompt": "x"}, headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    other = http["draft"].post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                               headers={"Origin": "http://evil.example"})
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    # off by default: no CORS headers, no preflight answer
    plain = httpx.options(servers["plain"].url + "/v1/chat/completions", headers=preflight)
    assert plain.status_code == 405 and "access-control-allow-origin" not in plain.headers


# ---- ignore_eos -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, speculative", [("draft", None), ("draft", False), ("plain", None)])
def test_ignore_eos(http, reference, kind, speculative):
    extra = {} if speculative is None else {"speculative": speculative}
    ended = http[kind].post("/v1/completions", json={"prompt": EOG_PROMPT, "max_tokens": 12, **extra}).json()
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] == 1
    body = {"prompt": EOG_PROMPT, "max_tokens": 12, "ignore_eos": True, **extra}
    d = http[kind].post("/v1/completions", json=body).json()
    assert d["choices"][0]["finish_reason"] == "length" and d["usage"]["completion_tokens"] == 12
    # greedy: the same text with or without the draft, streamed or not
    want = http["plain"].post("/v1/completions", json={**body, "speculative": None}).json()
    assert d["choices"][0]["text"] == want["choices"][0]["text"] != ""
    streamed = "".join(c["choices"][0]["text"] for c in chunks_of(http[kind], "/v1/completions", body)
                       if c["choices"])
    assert streamed == d["choices"][0]["text"]
    with_stop = http[kind].post("/v1/completions", json={**body, "stop": ["Return"], "max_tokens": 64}).json()
    assert with_stop["choices"][0]["finish_reason"] == "stop"  # a stop string still ends it
    assert_still_serving(http[kind], reference)


# ---- the usage chunk -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_usage_chunk_only_when_asked(http, oai, kind):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    plain = chunks_of(http[kind], "/v1/chat/completions", body)
    assert all(c["choices"] and "usage" not in c for c in plain)
    assert plain[-1]["choices"][0]["finish_reason"] == "length"
    assert plain[-1]["speculative"]["method"] == ("dspark" if kind == "draft" else "none")
    asked = chunks_of(http[kind], "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in asked[:-1])
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 6
    usages = [c.usage for c in oai[kind].completions.create(model="m", prompt="x", max_tokens=4, stream=True)]
    assert usages and all(u is None for u in usages)
    last = list(oai[kind].completions.create(model="m", prompt="x", max_tokens=4, stream=True,
                                             stream_options={"include_usage": True}))[-1]
    assert last.choices == [] and last.usage.completion_tokens == 4


# ---- /v1/embeddings ---------------------------------------------------------------------------------

def reference_embedding(llm: LLM, tokens: list[int]) -> np.ndarray:
    p = llm.context.params
    ctx = Context(llm.model, n_ctx=EMBD_CTX, n_seq_max=1, n_threads=1, flash_attn=p.flash_attn,
                  batch_invariant=p.batch_invariant)
    try:
        ctx.set_capture_layers([llm.model.n_layer])  # the residual stream entering the final norm
        ctx.decode(tokens)
        v = ctx.get_captured(copy=True).astype(np.float64).mean(axis=0)
    finally:
        ctx.close()
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("kind", KINDS)
def test_embeddings(http, oai, reference, kind):
    texts = ["def add(a, b):", "hello world"]
    e = oai[kind].embeddings.create(model="m", input=texts)  # the client asks for base64
    assert [d.index for d in e.data] == [0, 1]
    got = np.array([d.embedding for d in e.data])
    want = np.array([reference_embedding(reference, reference.tokenize(t, parse_special=True))
                     for t in texts])
    assert got.shape == (2, reference.model.n_embd)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    n_tokens = sum(len(reference.tokenize(t, parse_special=True)) for t in texts)
    assert (e.usage.prompt_tokens, e.usage.total_tokens) == (n_tokens, n_tokens)
    tokens = reference.tokenize(texts[0], parse_special=True)
    body = {"input": [tokens, texts[0]], "encoding_format": "float"}
    r = http[kind].post("/v1/embeddings", json=body).json()
    assert r["object"] == "list" and r["data"][0]["object"] == "embedding"
    assert r["data"][0]["embedding"] == r["data"][1]["embedding"]  # token ids or their text: the same
    single = http[kind].post("/v1/embeddings", json={"input": tokens, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(single["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == r["data"][0]["embedding"]
    assert_still_serving(http[kind], reference)  # the engine's context is not the embeddings'


def assert_bad_request(client, reference, route, body, param):
    """A 400 naming ``param``, with a message; the server then serves the next request."""
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]
    assert_still_serving(client, reference)


@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [1.5]}, "input"),
    ({"input": [[1, 2], 3]}, "input"), ({"input": [99999]}, "input"), ({"input": "x " * 200}, "input"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "dimensions": 3}, "dimensions"),
])
def test_bad_embeddings_are_400(http, reference, body, param):
    assert_bad_request(http["draft"], reference, "/v1/embeddings", body, param)


# ---- /v1/responses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_responses(http, oai, reference, kind):
    r = oai[kind].responses.create(model="m", input="hi", instructions="You write Python.",
                                   max_output_tokens=6)
    want = reference.chat([{"role": "system", "content": "You write Python."},
                           {"role": "user", "content": "hi"}], max_tokens=6)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == want.text and r.output[0].type == "message"
    assert r.output[0].content[0].type == "output_text"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (len(want.prompt_tokens), 6)
    assert r.usage.total_tokens == len(want.prompt_tokens) + 6
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "def f():"}]},
             {"role": "user", "content": "more"}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f():"},
                {"role": "user", "content": "more"}]
    body = {"input": items, "max_output_tokens": 64, "stop": ["\n"]}
    raw = http[kind].post("/v1/responses", json=body).json()
    done = reference.chat(messages, max_tokens=64, stop=["\n"])
    assert raw["status"] == "completed" and raw["incomplete_details"] is None
    assert raw["output"][0]["content"][0]["text"] == done.text


@pytest.mark.parametrize("kind", KINDS)
def test_responses_stream(http, oai, reference, kind):
    events = list(oai[kind].responses.create(model="m", input="hi", max_output_tokens=5, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == reference.chat([{"role": "user", "content": "hi"}], max_tokens=5).text
    last = events[-1].response
    assert last.output[0].content[0].text == text and last.usage.output_tokens == 5
    body = {"input": "hi", "max_output_tokens": 64, "stop": ["\n"], "stream": True}
    raw = sse(http[kind], "/v1/responses", body)
    assert all(name == data["type"] for name, data in raw)  # "event: <type>" with each
    assert raw[-1][0] == "response.completed" and raw[-1][1]["response"]["status"] == "completed"
    with oai[kind].responses.stream(model="m", input="hi", max_output_tokens=64,
                                    extra_body={"stop": ["\n"]}) as s:
        final = s.get_final_response()
    assert final.output_text == raw[-1][1]["response"]["output"][0]["content"][0]["text"]


@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": 3}, "input"), ({"input": []}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 3}]}, "input[0].arguments"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": 3}}},
     "text.format.schema"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 2**31}, "max_output_tokens"),
    ({"input": "x", "instructions": 5}, "instructions"),
])
def test_bad_responses_are_400(http, reference, body, param):
    assert_bad_request(http["draft"], reference, "/v1/responses", body, param)


# ---- bad inputs: 4xx, and the next request is served ---------------------------------------------

SURROGATE = b"x\\udfffy"
BAD_BODIES = [
    ("/v1/completions", b'{"prompt": "' + SURROGATE + b'", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "x", "stop": ["' + SURROGATE + b'"]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + SURROGATE + b'"}]}'),
    ("/v1/responses", b'{"input": "' + SURROGATE + b'"}'),
    ("/v1/embeddings", b'{"input": ["ok", "' + SURROGATE + b'"]}'),
    ("/tokenize", b'{"content": "' + SURROGATE + b'"}'),
    ("/v1/completions", b'{"prompt": "x", "\\ud800": 1}'),
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000),
    ("/v1/chat/completions", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2147483648}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 99999999999999999999999}'),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4294967296}'),
    ("/v1/completions", b'{"prompt": "x", "top_k": 2147483648}'),
    ("/v1/completions", b'{"prompt": "x", "speculative": {"n_max": 2147483648}}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": 1e999}'),
    ("/v1/completions", b'{"prompt": "x", "ignore_eos": 1}'),
    ("/v1/completions", b'{"prompt": ["x", 3]}'),
]


@pytest.mark.parametrize("kind", KINDS)
def test_bad_inputs_are_4xx_then_served(http, reference, kind):
    before = read_metrics(http[kind])
    for path, raw in BAD_BODIES:
        r = http[kind].post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, raw[:80], r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], err
    assert "surrogate" in http[kind].post("/tokenize", content=BAD_BODIES[5][1]).json()["error"]["message"]
    assert_still_serving(http[kind], reference)
    after = read_metrics(http[kind])
    n_400 = 'dspark_responses_total{status="400"}'
    assert after[n_400] - before.get(n_400, 0) >= len(BAD_BODIES)
    assert not any('status="5' in name for name in after)


def test_client_gone_mid_upload_is_not_an_error(servers, http, reference):
    srv = servers["draft"]
    before = read_metrics(http["draft"]).get('dspark_responses_total{status="499"}', 0)
    with socket.create_connection((HOST, srv.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100000\r\n\r\n"
                  b'{"prompt": "' + b"a" * 5000)
        time.sleep(0.3)  # the server is reading the body when the client leaves
    deadline = time.monotonic() + 10
    while read_metrics(http["draft"]).get('dspark_responses_total{status="499"}', 0) == before:
        assert time.monotonic() < deadline, "the disconnect was not noticed"
        time.sleep(0.05)
    m = read_metrics(http["draft"])
    assert not any('status="5' in name for name in m)
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()
    assert_still_serving(http["draft"], reference)


# ---- per-request speculative settings over time -------------------------------------------------

def test_many_distinct_speculative_settings_over_time(http, reference):
    """Settings are released when their last request finishes: far more than 8 distinct ones over
    the server's life are all served (and greedy output does not depend on them)."""
    want = reference.generate(PROMPTS[0], max_tokens=6).text
    # 7 block lengths (8 is the demo draft's maximum: the server's own), 9 confidence thresholds
    settings = [{"n_max": k} for k in range(1, 8)] + [{"p_min": j / 10} for j in range(1, 10)] + \
        [{"n_max": 3, "p_min": 0.5}, False, {"enabled": False}]
    for i, spec in enumerate(settings):
        body = {"prompt": PROMPTS[0], "max_tokens": 6, "speculative": spec, "ignore_eos": i % 2 == 1}
        r = http["draft"].post("/v1/completions", json=body)
        assert r.status_code == 200, (spec, r.text)
        assert r.json()["choices"][0]["text"] == want
    distinct = {(k, eos) for k in range(1, 8) for eos in (False, True)}
    for k, eos in sorted(distinct):  # 14 distinct engines, one after the other
        r = http["draft"].post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "ignore_eos": eos,
                                                        "speculative": {"n_max": k}})
        assert r.status_code == 200, r.text


# ---- metric names -----------------------------------------------------------------------------------

def test_metric_names_follow_prometheus_conventions(http):
    for kind in KINDS:
        text = http[kind].get("/metrics").text
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        helps = set(re.findall(r"^# HELP (\S+) .+$", text, re.M))
        assert types and set(types) == helps
        for name, kind_ in types.items():
            assert re.fullmatch(r"dspark_[a-z][a-z0-9_]*", name), name
            assert kind_ in ("counter", "gauge"), (name, kind_)
            if kind_ == "counter":
                assert name.endswith("_total"), f"counter {name} must end in _total"
            else:
                assert not name.endswith("_total"), f"gauge {name} must not end in _total"
            assert not re.search(r"_(rate|percent|milliseconds|ms)$", name), name  # ratios, base units
        for line in text.splitlines():
            if line and not line.startswith("#"):
                sample = re.match(r"([a-z_]+)(\{[^}]*\})? (\S+)$", line)
                assert sample and sample.group(1) in types, line
                float(sample.group(3))
        for want in ("dspark_slots", "dspark_slots_busy", "dspark_queue_depth", "dspark_requests_total",
                     "dspark_draft_acceptance_ratio", "dspark_tokens_per_verify_step",
                     "dspark_embedding_tokens_total", "dspark_prompt_tokens_cached_total", "dspark_slots_cached"):
            assert want in types, want
        assert types["dspark_slots"] == "gauge" and "dspark_slots_total" not in types
