"""llama-server's GET /slots against real server processes (the tiny pair, one slot; the target
alone with --no-slots): each slot's job while it runs and after, ?fail_on_no_slot, the 501 of a
server started without the endpoint, and /props saying which."""
from __future__ import annotations

import json
import time

import pytest

_, _, httpx = (pytest.importorskip(name) for name in ("fastapi", "uvicorn", "httpx"))

from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import FA_ARGS, http_clients, running_servers  # noqa: E402

COMMON = ["-t", "1", "-np", "1", *FA_ARGS]
PROMPT = "def fibonacci(n):\n"
LONG = 3500  # tokens: the stream runs for a while after its first chunk


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    yield from running_servers({"slots": (["-m", TARGET_PATH, "-md", DRAFT_PATH, *COMMON], None),
                                "off": (["-m", TARGET_PATH, "--no-slots", *COMMON], None)},
                               tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def http(servers):
    yield from http_clients(servers)


def slots(http, **params):
    r = http.get("/slots", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_slot_shows_its_last_job(http):
    before = slots(http["slots"])
    assert [s["id"] for s in before] == [0] and before[0]["is_processing"] is False
    done = http["slots"].post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                        "stop": ["zzz"]}).json()
    n_prompt = len(http["slots"].post("/tokenize", json={"content": PROMPT}).json()["tokens"])
    s = slots(http["slots"])[0]
    assert s["is_processing"] is False and s["speculative"] is True and s["id_task"] >= 0
    assert s["prompt"] == PROMPT and s["generated"] == done["choices"][0]["text"]
    assert s["n_prompt_tokens"] == n_prompt == done["usage"]["prompt_tokens"]
    assert s["n_prompt_tokens_processed"] + s["n_prompt_tokens_cache"] == n_prompt
    assert s["next_token"] == [{"has_next_token": False, "has_new_line": "\n" in s["generated"],
                                "n_remain": 0, "n_decoded": 6}]
    assert s["params"]["n_predict"] == 6 and s["params"]["temperature"] == 0 and s["params"]["stop"] == ["zzz"]
    again = slots(http["slots"])[0]
    assert again["id_task"] == s["id_task"]  # the same job until another runs
    http["slots"].post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    assert slots(http["slots"])[0]["id_task"] > s["id_task"]


def test_a_running_job_and_fail_on_no_slot(servers, http):
    body = {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True}
    with servers["slots"].client() as streamer, streamer.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
        s = slots(http["slots"])[0]
        assert s["is_processing"] is True and s["next_token"][0]["has_next_token"] is True
        assert 1 <= s["next_token"][0]["n_decoded"] < LONG
        assert s["next_token"][0]["n_remain"] == LONG - s["next_token"][0]["n_decoded"]
        busy = http["slots"].get("/slots", params={"fail_on_no_slot": 1})
        assert busy.status_code == 503 and "no slot available" in busy.json()["error"]["message"]
    # the client left: the job is cancelled and the slot becomes idle
    deadline = time.monotonic() + 60
    while slots(http["slots"])[0]["is_processing"] and time.monotonic() < deadline:
        time.sleep(0.05)
    s = slots(http["slots"])[0]
    assert s["is_processing"] is False and s["next_token"][0]["n_decoded"] < LONG
    assert slots(http["slots"], fail_on_no_slot=1)[0]["id"] == 0


def test_no_slots_server_answers_501(http):
    r = http["off"].get("/slots")
    assert r.status_code == 501 and "--no-slots" in r.json()["error"]["message"]
    assert http["off"].get("/props").json()["endpoint_slots"] is False
    assert http["slots"].get("/props").json()["endpoint_slots"] is True
