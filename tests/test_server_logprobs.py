"""Logprobs and the sampler fields through a real `dspark-ggml serve` (the tiny pair) with the official
`openai` client and raw HTTP: chat ``logprobs``/``top_logprobs`` and completions ``logprobs`` (with
``echo``), streamed and not, the same with the draft on and off, equal to ``LLM.generate``'s and to
a log-softmax of the target's own logits; ``logit_bias`` bans and forces tokens; the penalties change
the output and are lossless under speculation; every bad value is a 400 and the next request is served."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

_, _, openai, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "openai", "httpx"))

from dspark_ggml import LLM  # noqa: E402
from dspark_ggml.context import Context  # noqa: E402
from server_process import FA_ARGS, SERVER_FA, ServerProcess  # noqa: E402

from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

PROMPT = "def fibonacci(n):\n"
OFF = {"speculative": False}  # the same server, target only
K = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(["-m", TARGET_PATH, "-md", DRAFT_PATH, "-t", "1", "-np", "4",
                         "--spec-schedule", "static", *FA_ARGS], tmp_path_factory.mktemp("lp") / "server.log")
    yield srv
    assert srv.terminate() == 0, srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference():
    with LLM(TARGET_PATH, n_threads=1, flash_attn=SERVER_FA, batch_invariant=True) as llm:
        yield llm


def complete(http, **body) -> dict:
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, **body})
    assert r.status_code == 200, r.text
    return r.json()


def close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


# ---- values --------------------------------------------------------------------------------------

def test_completion_logprobs_are_the_targets_log_softmax(http, reference):
    """The first generated token's logprob and top entries against a log-softmax of the target's
    logits computed here (a Context on the same file: independent of the engine's sampler)."""
    d = complete(http, logprobs=K, max_tokens=1)
    lp = d["choices"][0]["logprobs"]
    prompt = reference.tokenize(PROMPT, parse_special=True)
    model = reference.model
    ctx = Context(model, n_ctx=128, n_threads=1, flash_attn=SERVER_FA, batch_invariant=True)
    try:
        ctx.decode(prompt)
        logits = ctx.get_logits(copy=True)[-1].astype(np.float64)
    finally:
        ctx.close()
    ls = logits - logits.max()
    ls = ls - math.log(np.exp(ls).sum())
    best = np.argsort(-ls, kind="stable")[:K]
    assert lp["tokens"][0] == reference.detokenize([int(best[0])], special=True)
    assert abs(lp["token_logprobs"][0] - ls[best[0]]) < 1e-3
    got = sorted(lp["top_logprobs"][0].values(), reverse=True)
    assert close(got, [float(ls[i]) for i in best], 1e-3)


def test_logprobs_equal_with_draft_on_and_off_and_to_llm_generate(http, oai, reference):
    on = complete(http, logprobs=K)["choices"][0]
    off = complete(http, logprobs=K, **OFF)["choices"][0]
    assert on["text"] == off["text"]
    a, b = on["logprobs"], off["logprobs"]
    assert a["tokens"] == b["tokens"] and close(a["token_logprobs"], b["token_logprobs"], 1e-5)
    assert [list(t) for t in a["top_logprobs"]] == [list(t) for t in b["top_logprobs"]]
    r = reference.generate(PROMPT, max_tokens=12, logprobs=K)
    n = len(a["tokens"])
    assert n == len(r.tokens) - (r.finish_reason == "stop")  # the ending token has none
    assert close(a["token_logprobs"], [e.logprob for e in r.logprobs[:n]])
    # greedy: the chosen token is the most probable one
    for chosen, top in zip(a["token_logprobs"], a["top_logprobs"]):
        assert len(top) == K and abs(chosen - max(top.values())) < 1e-6
    # chat through the openai client: the same values with the draft on and off
    msgs = [{"role": "user", "content": "Write a function that adds two numbers"}]
    c_on = oai.chat.completions.create(model="m", messages=msgs, max_tokens=10, logprobs=True, top_logprobs=3)
    c_off = oai.chat.completions.create(model="m", messages=msgs, max_tokens=10, logprobs=True,
                                        top_logprobs=3, extra_body=OFF)
    e_on, e_off = c_on.choices[0].logprobs.content, c_off.choices[0].logprobs.content
    assert [e.token for e in e_on] == [e.token for e in e_off] and len(e_on) == c_on.usage.completion_tokens
    assert close([e.logprob for e in e_on], [e.logprob for e in e_off], 1e-5)
    assert all(len(e.top_logprobs) == 3 and bytes(e.bytes).decode("utf-8", "replace") == e.token
               for e in e_on)
    assert "".join(e.token for e in e_on) == c_on.choices[0].message.content


def test_streamed_logprobs_equal_the_whole(http, oai):
    whole = complete(http, logprobs=2)["choices"][0]["logprobs"]
    tokens, values, offsets = [], [], []
    with http.stream("POST", "/v1/completions",
                     json={"prompt": PROMPT, "max_tokens": 12, "logprobs": 2, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lp = json.loads(line[6:])["choices"][0]["logprobs"]
                if lp:
                    tokens += lp["tokens"]
                    values += lp["token_logprobs"]
                    offsets += lp["text_offset"]
    assert tokens == whole["tokens"] and close(values, whole["token_logprobs"], 1e-6)
    assert offsets == whole["text_offset"]
    msgs = [{"role": "user", "content": "hi"}]
    whole_chat = oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, logprobs=True)
    streamed = [e for ch in oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, logprobs=True,
                                                         stream=True)
                for c in ch.choices if c.logprobs is not None for e in c.logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in whole_chat.choices[0].logprobs.content]


def test_echo_gives_the_prompts_logprobs(http, reference):
    d = complete(http, logprobs=1, echo=True, max_tokens=4)
    c = d["choices"][0]
    prompt = reference.tokenize(PROMPT, parse_special=True)
    lp = c["logprobs"]
    assert c["text"].startswith(PROMPT)
    assert len(lp["tokens"]) == len(prompt) + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    # echo alone: the prompt before the text, no logprobs
    plain = complete(http, echo=True, max_tokens=4)["choices"][0]
    assert plain["text"] == c["text"] and plain["logprobs"] is None


# ---- logit_bias and the penalties ----------------------------------------------------------------

def tokens_of(d: dict) -> list[str]:
    return d["choices"][0]["logprobs"]["tokens"]


def test_logit_bias_bans_and_forces(http, reference):
    base = tokens_of(complete(http, logprobs=0, max_tokens=16))
    ids = reference.tokenize("".join(base), add_special=False)
    common = max(set(ids), key=ids.count)
    piece = reference.detokenize([common], special=True)
    for extra in ({}, OFF):
        banned = tokens_of(complete(http, logprobs=0, max_tokens=16, logit_bias={str(common): -100}, **extra))
        assert piece not in banned and banned != base
        forced = complete(http, logprobs=0, max_tokens=8, logit_bias={"300": 100}, **extra)
        assert tokens_of(forced) == [reference.detokenize([300], special=True)] * 8
    sampled = complete(http, max_tokens=16, temperature=1.0, seed=3, logprobs=0,
                       logit_bias={str(common): -100})
    assert piece not in tokens_of(sampled)


@pytest.mark.parametrize("penalty", [{"presence_penalty": 1.5}, {"frequency_penalty": 1.0},
                                     {"repeat_penalty": 1.5, "penalty_last_n": 64}])
def test_penalties_change_the_output_and_are_lossless(http, penalty):
    none = complete(http, max_tokens=32)["choices"][0]["text"]
    on = complete(http, max_tokens=32, **penalty)["choices"][0]["text"]
    off = complete(http, max_tokens=32, **penalty, **OFF)["choices"][0]["text"]
    assert on != none
    assert on == off
    seeded = {"temperature": 0.8, "seed": 5, "max_tokens": 24, **penalty}
    text = complete(http, **seeded)["choices"][0]["text"]
    assert text == complete(http, **seeded, **OFF)["choices"][0]["text"]


# ---- bad values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logit_bias": {"4096": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"3": 150}}, "logit_bias"),
    ("/v1/completions", {"presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"repeat_penalty": -1}, "repeat_penalty"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
])
def test_bad_values_are_400_and_the_server_goes_on(http, path, body, param):
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    base = {"prompt": PROMPT} if path == "/v1/completions" else chat
    r = http.post(path, json={**base, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert complete(http, max_tokens=2)["choices"][0]["finish_reason"] == "length"
