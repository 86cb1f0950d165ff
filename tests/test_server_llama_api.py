"""llama-server's own fields and routes on `dspark-ggml serve`, against real server processes (one
with the demo draft and an API key, one target-only): ``timings`` on completions (whole and
streamed), /tokenize with_pieces, /apply-template, /props, the exceed_context_size_error of a prompt
longer than the context, and which routes need no API key."""
from __future__ import annotations

from typing import Any

import pytest

_, _, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "httpx"))

from dspark_ggml import __version__  # noqa: E402
from dspark_ggml.tokenizer import Tokenizer  # noqa: E402
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import FA_ARGS, ServerProcess, http_clients, running_servers, sse  # noqa: E402

KEY = "llama-api-test-key-0123456789"
N_CTX = 256
N_SLOTS = 2
COMMON = ["-t", "1", "-np", str(N_SLOTS), "-c", str(N_CTX), *FA_ARGS]
KINDS = ["draft", "plain"]
# long enough next to the 12 tokens generated after it that a repeat reuses its slot's cells
# (prompt_cache: a slot is reused in place when the prefix is at least half its cells)
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
MESSAGES = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "import os"}]
# pieces of many kinds: ASCII, a leading space, two- to four-byte characters a small byte-level
# vocabulary splits into single bytes (half characters: byte lists)
MIXED_TEXT = "def f(x):\n    return 'héllo wörld 日本語 🙂'"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """"draft": the demo pair (static schedule: it drafts every step) behind an API key;
    "plain": the target alone, no key."""
    pair = ["-m", TARGET_PATH, "-md", DRAFT_PATH, "--spec-schedule", "static", *COMMON]
    yield from running_servers({"draft": (pair, KEY), "plain": (["-m", TARGET_PATH, *COMMON], None)},
                               tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def http(servers):
    yield from http_clients(servers)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(TARGET_PATH)


def post_ok(client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chunks_of(client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = sse(client, path, {**body, "stream": True})
    assert events[-1][1] == "[DONE]"
    return [data for _, data in events[:-1]]


def assert_timings(t: dict[str, Any], *, n_prompt: int, n_completion: int, drafted: int | None,
                   accepted: int | None) -> None:
    """llama-server's timings fields, their counts against the usage, and the rates and per-token
    times derived from them as llama-server derives them (the first generated token comes with
    the prefill, so the generation rates count the others)."""
    keys = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
            "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    assert set(t) == keys | ({"draft_n", "draft_n_accepted"} if drafted else set()), t
    assert t["prompt_n"] + t["cache_n"] == n_prompt and t["prompt_n"] >= 1
    assert t["predicted_n"] == n_completion
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert t["prompt_per_second"] == pytest.approx(1000 * t["prompt_n"] / t["prompt_ms"])
    assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"])
    steps = n_completion - 1
    assert t["predicted_per_second"] == pytest.approx(1000 * steps / t["predicted_ms"])
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / steps)
    if drafted:
        assert (t["draft_n"], t["draft_n_accepted"]) == (drafted, accepted)
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"]


# ---- timings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_timings_in_whole_responses(http, kind, route):
    body = {"prompt": PROMPT} if route == "/v1/completions" else {"messages": MESSAGES}
    body = {**body, "max_tokens": 12, "ignore_eos": True}
    for attempt in range(2):  # the second finds the first's prompt in the prompt cache
        d = post_ok(http[kind], route, body)
        u, spec = d["usage"], d["speculative"]
        assert u["completion_tokens"] == 12
        assert_timings(d["timings"], n_prompt=u["prompt_tokens"], n_completion=12,
                       drafted=spec["drafted"], accepted=spec["accepted"])
        assert d["timings"]["cache_n"] == u["prompt_tokens_details"]["cached_tokens"]
        assert (spec["drafted"] > 0) == (kind == "draft")
    assert d["timings"]["cache_n"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_timings_in_streams(http, kind):
    """Where llama-server puts them: a completion's finish chunk; a chat's last event (the usage
    chunk when the request asked for one, else the finish chunk). No other chunk has them."""
    h = http[kind]
    base = {"max_tokens": 10, "ignore_eos": True}
    for route, body, usage in (("/v1/completions", {"prompt": PROMPT}, False),
                               ("/v1/completions", {"prompt": PROMPT}, True),
                               ("/v1/chat/completions", {"messages": MESSAGES}, False),
                               ("/v1/chat/completions", {"messages": MESSAGES}, True)):
        req = {**base, **body, **({"stream_options": {"include_usage": True}} if usage else {})}
        chunks = chunks_of(h, route, req)
        finish = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
        chat_usage = usage and route.endswith("chat/completions")
        carrying = [i for i, c in enumerate(chunks) if "timings" in c]
        want = [len(chunks) - 1] if chat_usage else [finish] + ([len(chunks) - 1] if usage else [])
        assert carrying == want, (route, usage, carrying)
        whole = post_ok(h, route, {**base, **body})
        n_prompt = whole["usage"]["prompt_tokens"]
        for i in carrying:
            spec = chunks[i]["speculative"]
            assert_timings(chunks[i]["timings"], n_prompt=n_prompt, n_completion=10,
                           drafted=spec["drafted"], accepted=spec["accepted"])
        if usage:
            assert chunks[-1]["usage"]["completion_tokens"] == chunks[-1]["timings"]["predicted_n"]


def test_timings_of_several_choices_are_summed(http):
    d = post_ok(http["plain"], "/v1/completions", {"prompt": [PROMPT, "import os\n"], "max_tokens": 5,
                                                   "ignore_eos": True, "cache_prompt": False})
    t = d["timings"]
    assert t["predicted_n"] == d["usage"]["completion_tokens"] == 10
    assert t["prompt_n"] + t["cache_n"] == d["usage"]["prompt_tokens"]
    assert t["predicted_per_second"] == pytest.approx(1000 * (10 - 2) / t["predicted_ms"])


# ---- /tokenize with_pieces ----------------------------------------------------------------------

def test_tokenize_with_pieces(http, tok):
    h = http["plain"]
    ids = post_ok(h, "/tokenize", {"content": MIXED_TEXT})["tokens"]
    assert ids == tok.encode(MIXED_TEXT, add_special=False, parse_special=True)  # unchanged without it
    assert post_ok(h, "/tokenize", {"content": MIXED_TEXT, "with_pieces": False})["tokens"] == ids
    pieces = post_ok(h, "/tokenize", {"content": MIXED_TEXT, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == ids and all(set(p) == {"id", "piece"} for p in pieces)
    raw = b""
    for p in pieces:
        piece = p["piece"]
        if isinstance(piece, str):  # valid UTF-8: the text
            assert piece.encode() == tok.token_to_piece(p["id"])
            raw += piece.encode()
        else:  # not valid UTF-8: the byte values
            assert all(isinstance(b, int) and 0 <= b < 256 for b in piece)
            with pytest.raises(UnicodeDecodeError):
                bytes(piece).decode("utf-8")
            raw += bytes(piece)
    assert any(isinstance(p["piece"], list) for p in pieces)  # the text has half characters
    assert raw.decode() == post_ok(h, "/detokenize", {"tokens": ids})["content"] == MIXED_TEXT
    # a control token written in the text is one token, its piece its text
    special = post_ok(h, "/tokenize", {"content": "<|im_end|>", "with_pieces": True})["tokens"]
    assert special == [{"id": tok.token_to_id("<|im_end|>"), "piece": "<|im_end|>"}]


def test_tokenize_with_pieces_not_a_bool_is_400(http):
    r = http["plain"].post("/tokenize", json={"content": "x", "with_pieces": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "with_pieces", r.text


# ---- /apply-template ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_apply_template_is_what_chat_feeds_the_model(http, tok, kind):
    h = http[kind]
    d = post_ok(h, "/apply-template", {"messages": MESSAGES})
    assert set(d) == {"prompt"}
    assert d["prompt"] == tok.apply_chat_template(MESSAGES)
    assert d["prompt"].endswith("<|im_start|>assistant\n")
    chat = post_ok(h, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 16})
    completion = post_ok(h, "/v1/completions", {"prompt": d["prompt"], "max_tokens": 16})
    assert chat["usage"]["prompt_tokens"] == completion["usage"]["prompt_tokens"]
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
    assert chat["usage"]["completion_tokens"] == completion["usage"]["completion_tokens"]


def test_apply_template_with_tools_is_the_chat_prompt(http):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "find a name",
                                               "parameters": {"type": "object", "properties": {}}}}]
    body = {"messages": MESSAGES, "tools": tools}
    prompt = post_ok(http["plain"], "/apply-template", body)["prompt"]
    assert "lookup" in prompt  # the ChatML template knows no tools: they go in the system prompt
    ids = post_ok(http["plain"], "/tokenize", {"content": prompt})["tokens"]  # the model adds no BOS
    chat = post_ok(http["plain"], "/v1/chat/completions", {**body, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
])
def test_bad_apply_template_is_400(http, body, param):
    r = http["plain"].post("/apply-template", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and param in (err["param"] or "")


# ---- /props -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_props(http, tok, kind):
    p = post_or_get(http[kind], "/props")
    meta = http[kind].get("/v1/models").json()["data"][0]["meta"]
    settings = p["default_generation_settings"]
    assert settings["n_ctx"] == meta["n_ctx"] == N_CTX
    params = settings["params"]
    # the server's defaults (no sampling flags given): greedy, 256 tokens, penalties off
    assert params == {"seed": 0xFFFFFFFF, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                      "repeat_last_n": 64, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                      "frequency_penalty": 0.0, "max_tokens": 256, "n_predict": 256, "ignore_eos": False,
                      "stream": False, "n_probs": 0}
    assert p["total_slots"] == N_SLOTS
    assert p["model_alias"] == http[kind].get("/v1/models").json()["data"][0]["id"] == "target"
    assert p["model_path"] == TARGET_PATH
    assert p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert p["chat_template"] == tok.chat_template
    assert p["bos_token"] == "" and tok.bos_id is None
    assert p["eos_token"] == tok.token_to_piece(tok.eos_id).decode()
    assert p["build_info"].startswith(f"dspark-ggml {__version__}, ggml ")
    assert (p["endpoint_slots"], p["endpoint_props"], p["endpoint_metrics"]) == (True, False, True)
    assert http[kind].get("/metrics").status_code == 200  # endpoint_metrics is true
    assert http[kind].get("/slots").status_code == 200  # endpoint_slots is true (--no-slots: 501)
    assert http[kind].post("/props", json={}).status_code == 405  # endpoint_props is false
    assert p["is_sleeping"] is False and p["ui"] is False


def test_props_sampling_flags(tmp_path, tok):
    """The params of /props are the command line's request defaults."""
    srv = ServerProcess(["-m", TARGET_PATH, "-t", "1", "-np", "1", "-c", "128", "--temp", "0.7",
                         "--top-k", "20", "-n", "33", "--seed", "7", *FA_ARGS], tmp_path / "server.log")
    try:
        params = post_or_get(srv.client(), "/props")["default_generation_settings"]["params"]
    finally:
        assert srv.terminate() == 0, srv.log()
    assert (params["temperature"], params["top_k"], params["seed"]) == (pytest.approx(0.7), 20, 7)
    assert params["max_tokens"] == params["n_predict"] == 33


def post_or_get(client, path: str) -> dict[str, Any]:
    r = client.get(path)
    assert r.status_code == 200, r.text
    return r.json()


# ---- a prompt longer than the context -----------------------------------------------------------

@pytest.mark.parametrize("route, body, n_prompt", [
    ("/v1/completions", {"prompt": [1] * (N_CTX + 50)}, N_CTX + 50),
    ("/v1/completions", {"prompt": [1] * N_CTX}, N_CTX),  # no room for one generated token
    ("/v1/completions", {"prompt": ["x", [1] * N_CTX], "stream": True}, N_CTX),
    ("/completions", {"prompt": [1] * N_CTX}, N_CTX),
])
def test_prompt_longer_than_the_context(http, route, body, n_prompt):
    for kind in KINDS:
        r = http[kind].post(route, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "exceed_context_size_error" and err["code"] == 400
        assert (err["n_prompt_tokens"], err["n_ctx"]) == (n_prompt, N_CTX)
        assert err["param"] == "prompt" and f"{n_prompt} tokens" in err["message"]
        assert_still_serving(http[kind])


def test_chat_longer_than_the_context(http, tok):
    messages = [{"role": "user", "content": "x " * N_CTX}]
    n_prompt = len(tok.encode_chat(messages))
    assert n_prompt >= N_CTX
    r = http["plain"].post("/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error"
    assert (err["n_prompt_tokens"], err["n_ctx"]) == (n_prompt, N_CTX)


def assert_still_serving(client) -> None:
    d = post_ok(client, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3})
    assert d["usage"]["completion_tokens"] == 3


# ---- the API key --------------------------------------------------------------------------------

def test_public_routes_need_no_api_key(servers, http):
    """llama-server's public routes are /health and /v1/health; all else needs the key."""
    url = servers["draft"].url
    for path in ("/health", "/v1/health"):
        r = httpx.get(url + path)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, (path, r.text)
        assert http["plain"].get(path).json() == {"status": "ok"}
    for method, path, body in (("GET", "/props", None), ("GET", "/models", None), ("GET", "/v1/models", None),
                               ("POST", "/apply-template", {"messages": MESSAGES}),
                               ("POST", "/tokenize", {"content": "x"})):
        r = httpx.request(method, url + path, json=body)
        assert r.status_code == 401, (path, r.text)
        assert http["draft"].request(method, path, json=body).status_code == 200, path


def test_the_api_key_is_taken_as_llama_server_takes_it(servers):
    """Authorization with or without "Bearer ", or X-Api-Key (Anthropic's clients) when there is no
    Authorization; a wrong key in either header is refused."""
    url = servers["draft"].url + "/props"
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"Authorization": KEY}, {"X-Api-Key": KEY},
                    {"X-Api-Key": f"Bearer {KEY}"}):
        assert httpx.get(url, headers=headers).status_code == 200, headers
    for headers in ({"Authorization": "Bearer wrong"}, {"X-Api-Key": "wrong"}, {"Authorization": f"Basic {KEY}"},
                    {"Authorization": "Bearer wrong", "X-Api-Key": KEY}):
        assert httpx.get(url, headers=headers).status_code == 401, headers
