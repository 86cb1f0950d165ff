"""The server's prompt cache, against real server processes on loopback driven by the official
`openai` client: a repeated prompt, a prompt with a new tail and a chat's next turn reuse the cells
a finished request left (usage.prompt_tokens_details.cached_tokens, /metrics), the output is the
one a server without the cache gives (greedy and seeded sampled, with and without the draft),
``cache_prompt: false`` declines, and a full cache gives up its least recently used cells."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

from server_process import running_servers  # noqa: E402

COMMON = ["-t", "1", "--spec-schedule", "static"]
PAIR = ["-m", TARGET_PATH, "-md", DRAFT_PATH]
SAMPLINGS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.9, "top_p": 0.95, "seed": 11}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """"cached": the pair with the prompt cache (the default); "fresh": the pair without it, the
    reference output; "plain": the target alone, cached; "small": the pair, cached, in 512 cells."""
    args = {"cached": [*PAIR, "-np", "3"], "fresh": [*PAIR, "-np", "3", "--no-cache-prompt"],
            "plain": ["-m", TARGET_PATH, "-np", "2"], "small": [*PAIR, "-np", "3", "-c", "512"]}
    yield from running_servers({name: ([*a, *COMMON], None) for name, a in args.items()}, tmp_path_factory.mktemp)


@pytest.fixture(scope="module")
def oai(servers):
    return {name: openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
            for name, srv in servers.items()}


def source(tag: str, n_lines: int) -> str:
    """A prompt of about 15 * n_lines tokens, its own for each tag."""
    return "".join(f"def {tag}_{i}(x):\n    return x * {i} + len('{tag}')\n" for i in range(n_lines))


def complete(client, prompt: str, max_tokens: int = 16, **kw):
    r = client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens,
                                  **SAMPLINGS["greedy"], **kw)
    return r.choices[0].text, r.usage


def cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("server", ["cached", "plain"])
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_repeated_prompt_comes_from_the_cache_with_the_same_output(oai, server, sampling):
    prompt = source(f"again_{server}_{sampling}", 10)
    kw = dict(SAMPLINGS[sampling])
    expected, _ = complete(oai["fresh"], prompt, extra_body=kw)
    text, usage = complete(oai[server], prompt, extra_body=kw)
    assert cached(usage) < 8 and text == expected  # other tests' prompts begin with "def " too
    text, usage = complete(oai[server], prompt, extra_body=kw)
    assert cached(usage) == usage.prompt_tokens - 1  # the last token is decoded for its logits
    assert text == expected
    # the server without the cache prefills every time
    _, usage = complete(oai["fresh"], prompt, extra_body=kw)
    assert cached(usage) == 0


def test_a_new_tail_reuses_the_common_prefix(oai):
    head = source("tail", 10)
    _, first = complete(oai["cached"], head)
    prompt = head + "class Queue:\n    pass\n"
    text, usage = complete(oai["cached"], prompt)
    assert first.prompt_tokens - 2 <= cached(usage) < usage.prompt_tokens
    assert text == complete(oai["fresh"], prompt)[0]


def test_a_chat_prefills_only_each_turns_new_tokens(oai):
    messages = [{"role": "system", "content": source("chat", 6)}]
    for turn in range(3):
        messages.append({"role": "user", "content": f"turn {turn}: def step_{turn}():"})
        replies, usages = [], []
        for name in ("cached", "fresh"):
            stream = oai[name].chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0,
                                                       stream=True, stream_options={"include_usage": True})
            chunks = list(stream)
            replies.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            usages.append(chunks[-1].usage)
        assert replies[0] == replies[1]
        if turn == 0:
            assert cached(usages[0]) < 8
        else:  # everything up to the last reply (less what re-tokenizing it changes) was cached
            assert cached(usages[0]) >= previous - 2
            assert usages[0].prompt_tokens - cached(usages[0]) < 40
        previous = usages[0].prompt_tokens
        messages.append({"role": "assistant", "content": replies[0]})


def test_a_diverging_prompt_shares_the_prefix_and_leaves_the_other_cache_alone(oai):
    system = source("shared", 6)
    x, y = system + source("first", 12), system + source("second", 12)
    _, first = complete(oai["cached"], x)
    text, usage = complete(oai["cached"], y)  # runs in another slot on x's first cells
    # shared in whole blocks of 64 positions (the system prompt is about 110 tokens)
    assert cached(usage) == 64
    assert text == complete(oai["fresh"], y)[0]
    text, usage = complete(oai["cached"], x)  # x's own cells are all still there
    assert cached(usage) == first.prompt_tokens - 1
    assert text == complete(oai["fresh"], x)[0]


def test_a_target_only_request_leaves_no_stale_draft_cells_behind(oai):
    """``speculative: false`` runs without the draft: its slot's draft cells keep the previous
    prompt's features, which the next drafting request must not reuse past what they match."""
    prompt = source("spec_off", 10)
    expected = complete(oai["fresh"], prompt)[0]
    assert complete(oai["cached"], prompt, extra_body={"speculative": False})[0] == expected
    for _ in range(2):  # the first finds the target's cells only; the second both caches' cells
        text, usage = complete(oai["cached"], prompt)
        assert text == expected
    assert cached(usage) == usage.prompt_tokens - 1


def test_cache_prompt_false_prefills_everything(oai, servers):
    prompt = source("declined", 8)
    expected, _ = complete(oai["cached"], prompt)
    text, usage = complete(oai["cached"], prompt, extra_body={"cache_prompt": False})
    assert cached(usage) == 0 and text == expected
    r = httpx.post(servers["cached"].url + "/v1/completions",
                   json={"prompt": prompt, "max_tokens": 2, "cache_prompt": "yes"})
    assert r.status_code == 400 and "cache_prompt" in r.text


def test_the_metrics_count_cached_tokens(oai, servers):
    prompt = source("metrics", 6)
    complete(oai["cached"], prompt)
    _, usage = complete(oai["cached"], prompt)
    text = httpx.get(servers["cached"].url + "/metrics").text
    assert int(re.search(r"^dspark_prompt_tokens_cached_total (\d+)$", text, re.M)[1]) >= cached(usage) > 0
    assert int(re.search(r"^dspark_slots_cached (\d+)$", text, re.M)[1]) >= 1


def test_a_full_cache_gives_up_its_least_recently_used_cells(oai):
    """512 cells hold two of these prompts (with their output), not three."""
    a, b, c = (source(tag, 9) for tag in ("lru_a", "lru_b", "lru_c"))
    outputs = {p: complete(oai["small"], p, max_tokens=8) for p in (a, b)}
    assert 2 * outputs[a][1].total_tokens < 512 < 3 * outputs[a][1].total_tokens
    complete(oai["small"], c, max_tokens=8)  # needs room: a's cells go, b's stay
    for p, hit in ((b, True), (a, False)):
        text, usage = complete(oai["small"], p, max_tokens=8)
        assert text == outputs[p][0]
        assert cached(usage) == usage.prompt_tokens - 1 if hit else cached(usage) < 8
