"""`dspark-ggml serve` as a real server process on loopback, driven by the official `openai` client
and by raw HTTP (httpx): lossless continuous batching under load, streaming, disconnects, a full
queue, bad requests, the API key, the body limit, /metrics, and SIGTERM draining."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

_, _, openai, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "openai", "httpx"))

from dspark_ggml import LLM  # noqa: E402
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import FA_ARGS, SERVER_FA, ServerProcess, read_metrics  # noqa: E402

KEY = "test-key-0123456789"
MODEL = "target"
MAX_BODY = 65536
COMMON = ["-m", TARGET_PATH, "-md", DRAFT_PATH, "-t", "1",  # tiny models: more threads only add overhead on a shared machine
          *FA_ARGS]
PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n", "for i in range(10):\n", "def main():\n",
           "try:\n", "with open(path) as f:\n", "if __name__ == '__main__':\n"]
QUESTIONS = ["Write a function that adds two numbers", "hi", "What does os.path.join do?"]


# ---- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The main server: 8 slots, room for every request of the load test, an API key, a small body limit."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    # the static schedule drafts every step (the default adaptive one may draft nothing on the demo
    # pair): losslessness under load is tested with drafts in every batch, and the stats have some
    srv = ServerProcess([*COMMON, "-np", "8", "--queue-size", "120", "--max-body", str(MAX_BODY),
                         "--spec-schedule", "static"], log, KEY)
    yield srv
    assert srv.terminate() == 0, srv.log()
    assert "Traceback" not in srv.log(), srv.log()  # no request ended in an internal error


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """One slot and no queue: a second request while one runs is refused; a long one can be cut off."""
    log = tmp_path_factory.mktemp("small") / "server.log"
    srv = ServerProcess([*COMMON, "-np", "1", "--queue-size", "0", "-c", "8192"], log)
    yield srv
    assert srv.terminate() == 0, srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def reference():
    """Target-only decoding in this process: what every greedy request must return. The server's
    kernels: batch-invariant ones, flash attention where it runs (DSPARK_TEST_SERVER_FA=off: the
    server and this reference without it)."""
    with LLM(TARGET_PATH, n_threads=1, flash_attn=SERVER_FA, batch_invariant=True) as llm:
        yield llm


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


# ---- the requests of the load test --------------------------------------------------------------

@dataclass
class Case:
    """One request: its endpoint, body, whether it streams and which client sends it."""

    i: int
    chat: bool
    stream: bool
    use_openai: bool
    body: dict[str, Any]

    @property
    def greedy(self) -> bool:
        return not self.body.get("temperature")


@dataclass
class Answer:
    text: str
    finish_reason: str
    completion_tokens: int


def make_cases(tokenize) -> list[Case]:
    """64 requests: mixed prompts (text, token ids, chat), lengths, greedy and seeded sampling,
    stop strings, per-request speculative settings, streaming or not, through either client."""
    cases = []
    for i in range(64):
        chat = i % 5 == 4
        body: dict[str, Any] = {"model": MODEL, "max_tokens": (4, 9, 16, 23, 32)[i % 5]}
        if chat:
            body["messages"] = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        else:
            prompt = PROMPTS[i % len(PROMPTS)]
            body["prompt"] = tokenize(prompt) if i % 7 == 3 else prompt
        if i % 3 == 1:
            body.update(temperature=0.8, top_p=0.95, seed=1000 + i)
            if i % 2:
                body.update(top_k=40, min_p=0.02)
        if i % 8 == 6:
            body["stop"] = ["\n\n", "):"]
        if i % 13 == 5:
            body["speculative"] = False
        elif i % 13 == 11:
            body["speculative"] = {"n_max": 3}
        cases.append(Case(i, chat, stream=i % 4 == 2, use_openai=i % 2 == 0, body=body))
    return cases


def send(case: Case, oai, http) -> Answer:
    return _send_openai(case, oai) if case.use_openai else _send_http(case, http)


def _send_openai(case: Case, oai) -> Answer:
    body = dict(case.body)
    extra = {k: body.pop(k) for k in ("top_k", "min_p", "speculative") if k in body}
    api = oai.chat.completions if case.chat else oai.completions
    if not case.stream:
        r = api.create(**body, extra_body=extra or None)
        c = r.choices[0]
        return Answer(c.message.content if case.chat else c.text, c.finish_reason, r.usage.completion_tokens)
    text, finish, usage = [], None, None
    usage_please = {"include_usage": True}
    for chunk in api.create(**body, stream=True, stream_options=usage_please, extra_body=extra or None):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for c in chunk.choices:
            text.append((c.delta.content or "") if case.chat else c.text)
            finish = c.finish_reason or finish
    return Answer("".join(text), finish, usage)


def _send_http(case: Case, http) -> Answer:
    path = "/v1/chat/completions" if case.chat else "/v1/completions"
    if not case.stream:
        r = http.post(path, json=case.body)
        assert r.status_code == 200, r.text
        d = r.json()
        c = d["choices"][0]
        return Answer(c["message"]["content"] if case.chat else c["text"], c["finish_reason"],
                      d["usage"]["completion_tokens"])
    body = {**case.body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = list(sse_events(http, path, body))
    text, finish, usage = [], None, None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
        for c in chunk["choices"]:
            text.append(c["delta"].get("content", "") if case.chat else c["text"])
            finish = c["finish_reason"] or finish
    return Answer("".join(text), finish, usage)


def sse_events(http, path: str, body: dict[str, Any]):
    """The JSON objects of an SSE response, checking it ends with [DONE]."""
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def expected(case: Case, reference: LLM) -> Answer:
    """Target-only decoding of a greedy case."""
    kw: dict[str, Any] = {"max_tokens": case.body["max_tokens"], "stop": case.body.get("stop")}
    b = case.body
    r = reference.chat(b["messages"], **kw) if case.chat else reference.generate(b["prompt"], **kw)
    return Answer(r.text, {"context_full": "length"}.get(r.finish_reason, r.finish_reason), len(r.tokens))


# ---- lossless under load ------------------------------------------------------------------------

def test_lossless_under_load(server, oai, http, reference):
    """64 concurrent requests each return what they return alone; greedy ones what the target alone
    generates (with and without the draft, whatever their batch mates)."""
    cases = make_cases(reference.tokenize)
    alone = [send(c, oai, http) for c in cases]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        loaded = list(pool.map(lambda c: send(c, oai, http), cases))
    greedy_mismatch = [c.i for c, a in zip(cases, alone) if c.greedy and a != expected(c, reference)]
    assert not greedy_mismatch, f"greedy requests unlike target-only LLM.generate: {greedy_mismatch}"
    greedy_batch = [c.i for c, a, b in zip(cases, alone, loaded) if c.greedy and a != b]
    assert not greedy_batch, f"greedy requests that differ alone and in the batch: {greedy_batch}"
    sampled_batch = [c.i for c, a, b in zip(cases, alone, loaded) if not c.greedy and a != b]
    assert not sampled_batch, f"seeded sampled requests that differ alone and in the batch: {sampled_batch}"
    metrics = read_metrics(http)
    assert metrics["dspark_slots_busy"] == 0 and metrics["dspark_queue_depth"] == 0
    assert metrics["dspark_drafted_tokens_total"] > 0 and metrics["dspark_accepted_tokens_total"] > 0


def test_n_choices_and_speculative_stats(http, reference):
    prompt = PROMPTS[0]
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "n": 3})
    assert r.status_code == 200, r.text
    d = r.json()
    want = reference.generate(prompt, max_tokens=12)
    assert [c["index"] for c in d["choices"]] == [0, 1, 2]
    assert all(c["text"] == want.text for c in d["choices"])  # greedy: every choice is the same
    cached = d["usage"].pop("prompt_tokens_details")["cached_tokens"]  # earlier tests sent this prompt too
    assert d["usage"] == {"prompt_tokens": len(want.prompt_tokens), "completion_tokens": 36,
                          "total_tokens": len(want.prompt_tokens) + 36}
    assert 0 <= cached < len(want.prompt_tokens)
    spec = d["speculative"]
    assert spec["method"] == "dspark" and spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["tau"] == pytest.approx((spec["accepted"] + spec["steps"]) / spec["steps"])
    off = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "speculative": False}).json()
    assert off["choices"][0]["text"] == want.text
    assert off["speculative"]["method"] == "none" and off["speculative"]["drafted"] == 0


def test_chat_stream_chunk_format(http, reference):
    messages = [{"role": "user", "content": "hi"}]
    body = {"messages": messages, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_events(http, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == reference.chat(messages, max_tokens=10).text


def test_models_tokenize_detokenize(oai, http, reference):
    assert [m.id for m in oai.models.list()] == [MODEL]
    tokens = http.post("/tokenize", json={"content": "import os"}).json()["tokens"]
    assert tokens == reference.tokenize("import os", add_special=False, parse_special=True)
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": "import os"}


# ---- refusals: the server answers, then goes on serving -----------------------------------------

@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": {"text": "x"}}, "prompt"),
    ({"prompt": "x", "top_p": "high"}, "top_p"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": [1, 2, 99999]}, "prompt"),
    ({"prompt": "x", "n": 9}, "n"),  # more choices than slots
    ({"prompt": "x", "logprobs": 30}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"99999": 5}}, "logit_bias"),
    ({"prompt": "x", "speculative": {"n_max": "many"}}, "n_max"),
    ({"max_tokens": 4}, "prompt"),
])
def test_bad_request_is_400(http, reference, body, param):
    # (a prompt longer than the context is llama-server's exceed_context_size_error, a 400 of its
    # own type: test_server_llama_api)
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert_still_serving(http, reference)


def test_bad_chat_and_bad_json_are_400(http, reference):
    for body in ({"messages": []}, {"messages": [{"role": "robot", "content": "x"}]},
                 {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}):
        assert http.post("/v1/chat/completions", json=body).status_code == 400
    r = http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert_still_serving(http, reference)


def test_openai_client_sees_bad_request(oai):
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=MODEL, prompt="x", max_tokens=0)


def test_api_key(server, http, reference):
    # (the key bare or in X-Api-Key is accepted, as llama-server: test_server_llama_api)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"X-Api-Key": "wrong"}):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/metrics", headers=headers).status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200  # open: probes carry no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert_still_serving(http, reference)


def test_body_limit_is_413(http, reference):
    big = {"prompt": "x" * (MAX_BODY + 1000)}
    r = http.post("/v1/completions", json=big)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large"
    chunked = http.post("/v1/completions", content=iter([json.dumps(big).encode()]))  # no Content-Length
    assert chunked.status_code == 413
    assert_still_serving(http, reference)


def test_unknown_path_and_method(http):
    assert http.get("/v1/nothing").status_code == 404
    assert http.get("/v1/completions").status_code == 405


def assert_still_serving(http, reference):
    r = http.post("/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference.generate(PROMPTS[1], max_tokens=8).text


# ---- one slot, no queue: disconnects and a full queue -------------------------------------------

def test_disconnect_frees_the_slot(small_server):
    """A client that goes away mid-stream: its sequence is removed at the next step."""
    with small_server.client() as http:
        m0 = read_metrics(http)
        before = m0.get('dspark_sequences_finished_total{reason="cancelled"}', 0)
        with http.stream("POST", "/v1/completions", json=LONG_REQUEST) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert read_metrics(http)["dspark_slots_busy"] == 1
        # leaving the block closed the connection
        m = wait_metrics(http, lambda m: m["dspark_slots_busy"] == 0)
        assert m.get('dspark_sequences_finished_total{reason="cancelled"}', 0) == before + 1
        generated = m["dspark_generated_tokens_total"] - m0["dspark_generated_tokens_total"]
        assert 0 < generated < LONG_REQUEST["max_tokens"]  # cut off, not finished
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}).status_code == 200


def test_disconnect_while_waiting_for_a_whole_response(small_server):
    with small_server.client() as http:
        before = read_metrics(http).get('dspark_sequences_finished_total{reason="cancelled"}', 0)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a long non-streamed request
            httpx.post(small_server.url + "/v1/completions", json={**LONG_REQUEST, "stream": False},
                       timeout=1.0)
        m = wait_metrics(http, lambda m: m["dspark_slots_busy"] == 0)
        assert m.get('dspark_sequences_finished_total{reason="cancelled"}', 0) == before + 1


def test_full_queue_is_503(small_server):
    with small_server.client() as http:
        with http.stream("POST", "/v1/completions", json=LONG_REQUEST) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: ")  # it holds the only slot now
            t0 = time.monotonic()
            refused = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
            health_s = _timed(lambda: http.get("/health"))
            assert read_metrics(http)["dspark_slots_busy"] == 1  # the long one still runs
            assert time.monotonic() - t0 < 10
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "unavailable_error"
        assert health_s < 2.0  # the HTTP side answers while the engine loop computes
        wait_metrics(http, lambda m: m["dspark_slots_busy"] == 0)
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4}).status_code == 200


LONG_REQUEST = {"prompt": PROMPTS[0], "max_tokens": 6000, "stream": True}


# ---- loading ------------------------------------------------------------------------------------

def test_health_is_503_while_loading():
    """Until the model is loaded /health (and every other endpoint) answers 503 with Retry-After."""
    import uvicorn

    from dspark_ggml.server.app import create_app
    from dspark_ggml.server.config import ServerConfig
    from dspark_ggml.server.state import ServerState
    from server_process import free_port

    release = threading.Event()

    def load() -> LLM:
        release.wait(30)
        return LLM(TARGET_PATH, n_threads=1)

    port = free_port()
    state = ServerState(ServerConfig(port=port, n_slots=1), load)
    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)  # not the main thread: uvicorn leaves signals alone
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _status(url + "/health") == 503)
        r = httpx.get(url + "/health")
        assert r.json()["status"] == "loading" and int(r.headers["retry-after"]) >= 1
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 503
        release.set()
        wait_for(lambda: _status(url + "/health") == 200)
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)
    assert state.llm is None  # the lifespan's end freed it


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ---- SIGTERM --------------------------------------------------------------------------------------

N_DRAIN = 600  # tokens: long enough to be still running when SIGTERM comes


def test_sigterm_drains_and_exits_0(tmp_path, reference):
    """Requests in flight when SIGTERM arrives finish whole; then the process exits 0."""
    srv = ServerProcess([*COMMON, "-np", "2", "--queue-size", "4"], tmp_path / "server.log")
    try:
        started = threading.Barrier(3)  # the two streams and this thread
        results: list[Any] = [None] * 2

        def stream(k: int) -> None:
            with srv.client() as http, http.stream("POST", "/v1/completions", json={
                    "prompt": PROMPTS[k], "max_tokens": N_DRAIN, "stream": True}) as r:
                lines = r.iter_lines()
                first = next(lines)
                started.wait(30)
                results[k] = [first, *lines]

        threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        started.wait(30)
        with srv.client() as http:
            assert read_metrics(http)["dspark_slots_busy"] == 2  # both streams are running
        rc = srv.terminate(timeout=60)
        for t in threads:
            t.join(30)
        assert rc == 0, srv.log()
        for k in range(2):
            lines = [line for line in results[k] if line]
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(line[6:]) for line in lines[:-1]]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            assert text == reference.generate(PROMPTS[k], max_tokens=N_DRAIN).text
    finally:
        srv.stop()


# ---- helpers --------------------------------------------------------------------------------------



def wait_metrics(http, ok, timeout: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = read_metrics(http)
        if ok(m) or time.monotonic() > deadline:
            assert ok(m), m
            return m
        time.sleep(0.05)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
