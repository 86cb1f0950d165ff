"""Logprobs and the sampler fields through the user-facing layers: LLM.generate / generate_batch /
stream and `dspark-ggml generate --json --logprobs K`, with the draft on and off."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_ggml import LLM, SamplingParams
from dspark_ggml.cli import main
from dspark_ggml.errors import InvalidArgumentError

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def models(tiny_pair):
    return tiny_pair


@pytest.fixture(scope="module")
def llms(models):
    with LLM(models[0], draft_model_path=models[1], n_threads=1) as spec, LLM(models[0], n_threads=1) as plain:
        yield spec, plain


def _entries(result):
    return [(e.token, e.logprob, e.top) for e in result.logprobs]


@pytest.mark.parametrize("sp", [
    SamplingParams(max_tokens=16, logprobs=3, prompt_logprobs=2),
    SamplingParams(max_tokens=16, logprobs=0, temperature=0.8, top_p=0.9, seed=3, presence_penalty=0.8,
                   logit_bias={5: 2.0}),
    SamplingParams(max_tokens=16, logprobs=5, repeat_penalty=1.3, frequency_penalty=0.4),
])
def test_generate_logprobs_are_the_same_with_and_without_the_draft(llms, sp):
    spec, plain = llms
    a, b = spec.generate(PROMPT, sp), plain.generate(PROMPT, sp)
    assert a.tokens == b.tokens and _entries(a) == _entries(b)
    assert [e.token for e in a.logprobs] == a.tokens
    assert all(len(e.top) == sp.logprobs and e.logprob <= 0.0 for e in a.logprobs)
    assert all(np.all(np.diff([lp for _, lp in e.top]) <= 0) for e in a.logprobs)  # descending
    if sp.prompt_logprobs is not None:
        assert a.prompt_logprobs[0] is None and len(a.prompt_logprobs) == len(a.prompt_tokens)
        assert [e.token for e in a.prompt_logprobs[1:]] == a.prompt_tokens[1:]
        assert [(e.logprob, e.top) for e in a.prompt_logprobs[1:]] == [(e.logprob, e.top) for e in b.prompt_logprobs[1:]]
    else:
        assert a.prompt_logprobs is None
    # streamed and batched: the same entries
    streamed = [e for c in spec.stream(PROMPT, sp) for e in (c.logprobs or [])]
    assert [(e.token, e.logprob, e.top) for e in streamed] == _entries(a)
    batch = spec.generate_batch([PROMPT, "hello"], [sp, SamplingParams(max_tokens=5)])
    assert _entries(batch[0]) == _entries(a) and batch[1].logprobs is None


def test_results_without_logprobs_have_none(llms):
    r = llms[0].generate(PROMPT, max_tokens=4)
    assert r.logprobs is None and r.prompt_logprobs is None
    assert "logprobs" not in r.to_dict()


def test_llm_refuses_a_logit_bias_outside_the_vocabulary(llms):
    with pytest.raises(InvalidArgumentError, match="logit_bias"):
        llms[0].generate(PROMPT, max_tokens=4, logit_bias={10**6: 1.0})
    with pytest.raises(InvalidArgumentError, match="top_logprobs|logprobs"):
        llms[0].generate(PROMPT, max_tokens=4, logprobs=30)


def test_cli_generate_json_logprobs(models, llms, capsys):
    rc = main(["generate", "-m", models[0], "-md", models[1], "-t", "1", "-n", "8", "--json", "--logprobs", "2",
               "--repeat-penalty", "1.2", "-p", PROMPT])
    out = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out)
    ref = llms[1].generate(PROMPT, SamplingParams(max_tokens=8, logprobs=2, repeat_penalty=1.2))
    assert d["tokens"] == ref.tokens
    assert d["logprobs"] == [{"token": t, "logprob": lp, "top": [list(x) for x in top]} for t, lp, top in _entries(ref)]


def test_cli_logprobs_needs_json(models, capsys):
    assert main(["generate", "-m", models[0], "-t", "1", "-n", "2", "--logprobs", "2", "-p", PROMPT]) != 0


def test_the_chunk_that_ends_on_a_token_says_so_and_the_server_drops_that_entry(llms):
    """One chunk rule for both loops (LiveSequence.chunk): the Python API lists the logprob of the
    token that ended the sequence (it is in ``tokens``), the server's OpenAI shape leaves it out."""
    from dspark_ggml.server.generation import chunk_logprobs

    spec, plain = llms
    want = plain.generate(PROMPT, SamplingParams(max_tokens=8)).tokens
    stop_id = want[3]  # the fourth greedy token ends generation as a stop token
    sp = SamplingParams(max_tokens=8, logprobs=2, stop_token_ids=[stop_id])
    for llm in (spec, plain):
        chunks = list(llm.stream(PROMPT, sp))
        last = chunks[-1]
        assert last.finish_reason == "stop" and last.ended_by_token
        assert not any(c.ended_by_token for c in chunks[:-1])
        tokens = [t for c in chunks for t in c.tokens]
        entries = [e for c in chunks for e in c.logprobs]
        assert tokens == want[:4] and [e.token for e in entries] == tokens
        served = [e for c in chunks for e in chunk_logprobs(c)]
        assert [e.token for e in served] == want[:3]
