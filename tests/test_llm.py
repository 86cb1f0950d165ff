"""The high-level LLM API: greedy output equal to the low-level engine (with and without drafts),
streaming, batches, chat, stop strings and tokens, limits, aborts and Ctrl-C, option checks."""
from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from dspark_ggml import LLM, GenerationResult, SamplingParams, SpeculativeConfig, load
from dspark_ggml.context import Context
from dspark_ggml.engine import Engine
from dspark_ggml.errors import DSparkError, InvalidArgumentError
from dspark_ggml.model import Model
from dspark_ggml.speculative import resolve_method
from dspark_ggml.stops import StopStringMatcher
from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target
from dspark_ggml.tokenizer import Tokenizer
from tests.gguf_edit import rewrite_gguf

PROMPTS = ["The quick brown fox", "def main():", "What is the capital", "Paris"]
EOG_PROMPT = "hello world"  # the tiny target ends this one with an end-of-generation token
N = 40  # tokens per test generation


def _engine_greedy(path, prompt: list[int], max_tokens: int | None, eog) -> list[int]:
    """The reference: target-only greedy decoding through the low-level Engine."""
    model = Model(path)
    with Context(model, n_ctx=512, n_threads=1) as ctx, Engine(ctx, eog=sorted(eog)) as engine:
        return engine.generate(prompt, SamplingParams(max_tokens=max_tokens))


def _bigram_draft(d, tcfg: TargetConfig, sequences: list[list[int]]):
    """A DSpark draft whose Markov head replays the target's own greedy transitions (prev -> next)
    over a zero lm head: its drafts are often accepted, so steps commit several tokens."""
    V = tcfg.n_vocab
    trans = np.zeros((V, V))
    for seq in sequences:
        for a, b in zip(seq, seq[1:]):
            trans[a, b] += 1
    w2 = np.zeros((V, V), np.float32)  # numpy [Vd, R]: bias[next] = w2[next, prev]
    for prev in range(V):
        if trans[prev].sum():
            w2[int(trans[prev].argmax()), prev] = 30.0
    write_draft(d / "bigram_src.gguf", DraftConfig(block_size=6, markov_rank=V, own_head=True), tcfg, seed=3)
    return rewrite_gguf(d / "bigram_src.gguf", d / "bigram.gguf", tensors={
        "markov_w1.weight": np.eye(V, dtype=np.float32), "markov_w2.weight": w2,
        "output.weight": np.zeros((V, tcfg.n_embd), np.float32)})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    tcfg = TargetConfig()
    write_target(d / "t.gguf", tcfg, seed=0)
    write_target(d / "bare.gguf", TargetConfig(with_tokenizer=False), seed=0)  # no tokenizer, so no eog
    write_draft(d / "dspark.gguf", DraftConfig(), tcfg, seed=1)
    write_draft(d / "dflash.gguf", DraftConfig(kind="dflash", block_size=5), tcfg, seed=1)
    tok = Tokenizer.from_gguf(d / "t.gguf")
    refs = {p: _engine_greedy(d / "t.gguf", tok.encode(p), N, tok.eog_ids) for p in PROMPTS + [EOG_PROMPT]}
    _bigram_draft(d, tcfg, [tok.encode(p) + refs[p] for p in refs])
    paths = {name: str(d / f"{name}.gguf") for name in ("bare", "dspark", "dflash", "bigram")}
    return {"target": str(d / "t.gguf"), **paths, "tok": tok, "refs": refs}


@pytest.fixture(scope="module")
def target_llm(models):
    with LLM(models["target"], n_ctx=512, n_threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def bigram_llm(models):
    # a fixed block: these tests count drafts, which the default schedule spends where they pay
    with LLM(models["target"], draft_model_path=models["bigram"], n_ctx=512, n_threads=1,
             speculative={"schedule": "static"}) as llm:
        yield llm


# ---- lossless greedy output ---------------------------------------------------------------------


def test_generate_equals_the_low_level_engine(models, target_llm):
    refs, tok = models["refs"], models["tok"]
    for prompt in PROMPTS:
        r = target_llm.generate(prompt, max_tokens=N)
        assert r.tokens == refs[prompt]
        assert r.prompt_tokens == tok.encode(prompt)
        assert r.text == tok.decode(r.tokens)
        assert r.finish_reason == "length" and r.stats.n_generated == N


@pytest.mark.parametrize("draft", ["dspark", "dflash", "bigram"])
def test_speculative_output_equals_target_only(models, draft):
    with LLM(models["target"], draft_model_path=models[draft], n_ctx=512, n_threads=1) as llm:
        assert llm.method == ("dflash" if draft == "dflash" else "dspark")
        for prompt in PROMPTS:
            assert llm.generate(prompt, max_tokens=N).tokens == models["refs"][prompt]


def test_drafts_are_accepted_and_counted(models, bigram_llm):
    r = bigram_llm.generate(PROMPTS[0], max_tokens=N)
    assert sum(r.from_draft) == r.stats.n_accepted > 0
    assert r.stats.mean_accepted_length > 1.5
    assert 0 < r.stats.acceptance_rate <= 1 and r.stats.tokens_per_second > 0
    d = r.stats.to_dict()
    assert d["n_accepted"] == r.stats.n_accepted and len(d["acceptance_by_position"]) == bigram_llm.n_draft


def test_token_prompt_equals_text_prompt(models, target_llm):
    ids = target_llm.tokenize(PROMPTS[1])
    assert target_llm.detokenize(ids) == PROMPTS[1]
    from_text = target_llm.generate(PROMPTS[1], max_tokens=8).tokens
    assert target_llm.generate(ids, max_tokens=8).tokens == from_text
    assert target_llm(np.array(ids), max_tokens=8).tokens == models["refs"][PROMPTS[1]][:8]


# ---- streaming, batches, chat -------------------------------------------------------------------


def test_stream_concatenates_to_generate(models, bigram_llm):
    for prompt in PROMPTS[:2] + [EOG_PROMPT]:
        whole = bigram_llm.generate(prompt, max_tokens=N)
        chunks = list(bigram_llm.stream(prompt, max_tokens=N))
        assert "".join(c.text for c in chunks) == whole.text
        assert sum((c.tokens for c in chunks), []) == whole.tokens
        assert sum((c.from_draft for c in chunks), []) == whole.from_draft
        assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
        assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].stats is not None
        assert len(chunks[0].tokens) == 1  # the prefill's token
    assert any(len(c.tokens) > 1 for c in chunks)  # steps that accepted drafts


def test_batch_equals_single_prompts(models):
    prompts = PROMPTS + [EOG_PROMPT]
    with LLM(models["target"], draft_model_path=models["bigram"], n_ctx=512, n_seq_max=2, n_threads=1) as llm:
        results = llm.generate_batch(prompts, max_tokens=N)  # 5 prompts in 2 slots: three wait
        assert [r.tokens for r in results] == [models["refs"][p] for p in prompts]
        assert [r.finish_reason for r in results] == ["length"] * 4 + ["stop"]
        assert all(isinstance(r, GenerationResult) for r in results)
        assert [r.stats.n_prompt for r in results] == [len(r.prompt_tokens) for r in results]
        assert llm.context.kv_n_used == 0


def test_chat_applies_the_template(models, target_llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = target_llm.chat(messages, max_tokens=12)
    prompt = models["tok"].encode_chat(messages)
    assert r.prompt_tokens == prompt
    assert r.tokens == target_llm.generate(prompt, max_tokens=12).tokens
    assert "".join(c.text for c in target_llm.stream_chat(messages, max_tokens=12)) == r.text


# ---- how generation ends ------------------------------------------------------------------------


def test_end_of_generation_token(models, target_llm):
    r = target_llm.generate(EOG_PROMPT, max_tokens=N)
    assert r.finish_reason == "stop" and r.tokens[-1] in models["tok"].eog_ids
    assert r.text == models["tok"].decode(r.tokens[:-1])


def test_max_tokens_gives_length(target_llm):
    r = target_llm.generate(PROMPTS[0], max_tokens=3)
    assert (len(r.tokens), r.finish_reason) == (3, "length")


def test_context_full(models):
    with LLM(models["bare"], n_ctx=16, n_threads=1) as llm:
        r = llm.generate(list(range(1, 11)), max_tokens=None)
        # every cell holds a token; the last token generated needs no cell of its own
        assert r.finish_reason == "context_full" and len(r.tokens) == 16 - 10 + 1
        assert r.text == ""  # no tokenizer: token ids only
        with pytest.raises(InvalidArgumentError, match="does not fit in n_ctx"):
            llm.generate(list(range(1, 17)))


def test_a_batch_that_fills_the_shared_cache(models):
    prompts = [list(range(1, 11)), list(range(20, 30)), [5, 6, 7]]
    with LLM(models["bare"], n_ctx=32, n_seq_max=2, n_threads=1) as llm:
        alone = [llm.generate(p, max_tokens=None).tokens for p in prompts]
        results = llm.generate_batch(prompts, max_tokens=None)
        # the two first share the 32 cells: the longer is ended when they run out, the other goes on
        assert [r.finish_reason for r in results] == ["context_full"] * 3
        assert all(alone[i][: len(r.tokens)] == r.tokens for i, r in enumerate(results))
        assert len(results[0].tokens) + len(results[1].tokens) < len(alone[0]) + len(alone[1])
        assert results[2].tokens == alone[2]  # it ran once a slot and cells were free
        assert llm.context.kv_n_used == 0


def _stop_text(tok, tokens: list[int], first: int) -> tuple[str, int]:
    """A stop string made of the text of two tokens of the output, tokens[i] and tokens[i+1] (so it
    is split across streamed pieces), whose first occurrence in the output is there; and how many
    tokens the output keeps (up to the one that completes it)."""
    text = tok.decode(tokens)
    for i in range(first, len(tokens) - 1):
        before, a, b = tok.decode(tokens[:i]), tok.decode(tokens[i:i + 1]), tok.decode(tokens[i + 1:i + 2])
        stop = a + b
        clean = a and b and "\ufffd" not in stop
        if clean and text.startswith(before + stop) and text.find(stop) == len(before):
            return stop, i + 2
    raise AssertionError("no usable stop string in the reference output")


@pytest.mark.parametrize("llm_name", ["target_llm", "bigram_llm"])
def test_stop_string_cuts_the_text(models, llm_name, request):
    llm = request.getfixturevalue(llm_name)
    tok, full = models["tok"], models["refs"][PROMPTS[0]]
    stop, n_kept = _stop_text(tok, full, 5)
    r = llm.generate(PROMPTS[0], max_tokens=N, stop=["never appears", stop])
    assert r.finish_reason == "stop"
    assert r.text == tok.decode(full)[: tok.decode(full).find(stop)]
    assert r.tokens == full[:n_kept]  # up to the token that completed the stop string
    chunks = list(llm.stream(PROMPTS[0], max_tokens=N, stop=stop))
    assert "".join(c.text for c in chunks) == r.text
    assert all(stop not in c.text for c in chunks)
    assert llm.context.kv_n_used == 0


def test_stop_string_matcher_holds_back_partial_stops():
    m = StopStringMatcher(["</end>", "xyz"])
    assert m.feed("abc</") == "abc"      # "</" might start "</end>"
    assert m.feed("en") == ""
    assert m.feed("x") == "</en"         # it did not; "x" might start "xyz"
    assert m.feed("y") == ""
    assert m.feed("z tail") == "" and m.stopped
    m = StopStringMatcher(["ab"])
    assert m.feed("xa") == "x" and m.flush() == "a"  # generation ended: the held text is released
    assert StopStringMatcher([]).feed("anything") == "anything"


def test_stop_token_ids(models, target_llm):
    full = models["refs"][PROMPTS[2]]
    k = 6
    r = target_llm.generate(PROMPTS[2], max_tokens=N, stop_token_ids=[full[k]])
    first = full.index(full[k])
    assert r.finish_reason == "stop" and r.tokens == full[: first + 1]
    assert r.text == models["tok"].decode(full[:first])  # the stop token's text is left out


# ---- abort and Ctrl-C ---------------------------------------------------------------------------


def test_abort_from_a_stream_returns_partial_output(models, bigram_llm):
    chunks = []
    for chunk in bigram_llm.stream(PROMPTS[0], max_tokens=N):
        chunks.append(chunk)
        if len(chunks) == 2:
            bigram_llm.abort()
    assert chunks[-1].finish_reason == "aborted" and chunks[-1].stats is not None
    tokens = sum((c.tokens for c in chunks), [])
    assert 1 < len(tokens) < N and tokens == models["refs"][PROMPTS[0]][: len(tokens)]
    assert bigram_llm.context.kv_n_used == 0 and bigram_llm.draft_context.kv.n_used == 0
    assert bigram_llm.generate(PROMPTS[0], max_tokens=N).tokens == models["refs"][PROMPTS[0]]


def test_abort_from_another_thread(models):
    with LLM(models["bare"], n_ctx=8192, n_seq_max=2, n_threads=1) as llm:
        timer = threading.Timer(0.05, llm.abort)
        timer.start()
        results = llm.generate_batch([[1, 2, 3]] * 3, max_tokens=None)
        timer.join()
        assert [r.finish_reason for r in results] == ["aborted"] * 3
        assert 0 < len(results[0].tokens) < 8000 and results[2].tokens == []  # the third never started
        assert llm.context.kv_n_used == 0
        assert llm.generate([1, 2, 3], max_tokens=5).tokens == results[0].tokens[:5]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_raises_keyboard_interrupt_and_leaves_the_llm_usable(models):
    """SIGINT is raised from inside the first step after the first streamed token (the engine's
    abort callback sends it), so it always lands while the engine computes, however busy the machine."""
    with LLM(models["bare"], n_ctx=8192, n_threads=1) as llm:
        armed, sent = [False], []

        def send_sigint_once() -> bool:
            if armed[0] and not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler before the next line
            return llm._interrupt.is_set()

        llm.engine.set_abort_callback(send_sigint_once)
        chunks = []
        with pytest.raises(KeyboardInterrupt):
            for chunk in llm.stream([1, 2, 3], max_tokens=None):
                chunks.append(chunk)
                armed[0] = True
        assert sent and len(chunks) == 1  # the step after the first token was stopped
        llm.engine.set_abort_callback(llm._interrupt.is_set)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert llm.context.kv_n_used == 0
        r = llm.generate([1, 2, 3], max_tokens=5)
        assert r.finish_reason == "length" and len(r.tokens) == 5
        assert r.tokens[0] == chunks[0].tokens[0]


def test_an_unfinished_stream_ends_when_another_generation_starts(models, target_llm):
    stream = target_llm.stream(PROMPTS[0], max_tokens=N)
    next(stream)
    assert target_llm.generate(PROMPTS[1], max_tokens=N).tokens == models["refs"][PROMPTS[1]]
    assert list(stream) == []
    assert target_llm.context.kv_n_used == 0


# ---- options and errors -------------------------------------------------------------------------


def test_speculative_config_validation_and_round_trip():
    c = SpeculativeConfig.from_dict({"method": "draft-dspark", "num_speculative_tokens": 3, "p_min": 0.2})
    assert (c.method, c.n_max, c.p_min) == ("dspark", 3, 0.2)
    assert SpeculativeConfig.from_dict(c.to_dict()) == c
    for bad, match in [({"method": "eagle"}, "method"), ({"n_max": -1}, "n_max"), ({"p_min": 1.5}, "p_min"),
                       ({"n_max": 2, "n_min": 3}, "n_min"), ({"draft_mode": "beam"}, "draft_mode"),
                       ({"schedule": "x"}, "schedule"), ({"block": 3}, "unknown speculative option")]:
        with pytest.raises(InvalidArgumentError, match=match):
            SpeculativeConfig.from_dict(bad)


def test_the_default_schedule_is_the_one_that_stops_drafting_where_it_does_not_pay(models):
    """"auto": the confidence schedule with a draft whose confidence head is calibrated (its
    temperatures in the GGUF), the adaptive one with an uncalibrated head (whose confidences may be
    anything: a planted draft's random head cut blocks that were all accepted, 1.75x where
    adaptive made 3.04x) or none (DFlash), the fixed block where the context cannot hold their
    calibration."""
    assert SpeculativeConfig().schedule == "auto"
    calibrated = rewrite_gguf(models["dspark"], Path(models["dspark"]).with_name("calibrated.gguf"),
                              set_keys={"dflash.confidence_temperatures": [1.5, 1.2, 1.0, 1.0]})
    with LLM(models["target"], draft_model_path=calibrated, n_ctx=256, n_threads=1) as llm:
        assert llm.draft_model.confidence_calibrated and llm.speculative.schedule == "confidence"
    for draft in ("dspark", "dflash"):
        with LLM(models["target"], draft_model_path=models[draft], n_ctx=256, n_threads=1) as llm:
            assert not llm.draft_model.confidence_calibrated and llm.speculative.schedule == "adaptive"
    with LLM(models["target"], draft_model_path=models["dspark"], n_ctx=6, n_threads=1) as llm:
        assert llm.speculative.schedule == "static"
    with LLM(models["target"], draft_model_path=models["dspark"], n_ctx=256, n_threads=1,
             speculative={"schedule": "static"}) as llm:  # a schedule asked for is kept
        assert llm.speculative.schedule == "static"


def test_the_summary_line_says_what_the_draft_did():
    from dspark_ggml.cli.args import format_stats
    from dspark_ggml.results import GenerationStats

    def line(drafting_steps: int, n_steps: int = 10) -> str:
        st = GenerationStats(n_prompt=5, n_generated=20, n_steps=n_steps, n_drafted=4 * drafting_steps,
                             n_accepted=2 * drafting_steps, drafted_at=[drafting_steps] * 4,
                             accepted_at=[drafting_steps] * 2 + [0, 0], t_decode_ms=100.0)
        return format_stats(st, "length", "dspark")

    assert "drafted in 10 of 10 steps, 40 tokens drafted, 20 accepted (acceptance rate 50.0%)" in line(10)
    assert "paused" not in line(10)
    assert line(4).endswith("drafting paused in 6 steps where it did not pay")
    assert line(0).endswith("drafting paused: it did not pay")
    assert "dspark" not in format_stats(GenerationStats(n_generated=3, n_steps=2), "length", "none")


def test_method_resolution():
    assert resolve_method("auto", "dspark") == "dspark" and resolve_method("auto", "dflash") == "dflash"
    assert resolve_method("auto", None) == "none" and resolve_method("none", "dspark") == "none"
    with pytest.raises(InvalidArgumentError, match="needs a draft"):
        resolve_method("dflash", None)


def test_method_against_the_draft(models):
    with pytest.raises(InvalidArgumentError, match=r"DFlash draft.*method 'dspark'"):
        LLM(models["target"], draft_model_path=models["dflash"], speculative={"method": "dspark"},
            n_threads=1)
    with pytest.raises(InvalidArgumentError, match=r"DSpark draft.*method 'dflash'"):
        LLM(models["target"], draft_model_path=models["dspark"],
            speculative=SpeculativeConfig(method="dflash"), n_threads=1)
    with LLM(models["target"], draft_model_path=models["dspark"], speculative={"method": "none"}, n_ctx=512,
             n_threads=1) as llm:
        assert (llm.method, llm.draft_model, llm.n_draft) == ("none", None, 0)
        assert llm.generate(PROMPTS[0], max_tokens=N).tokens == models["refs"][PROMPTS[0]]


def test_output_rows_are_sized_from_the_draft(models):
    with load(models["target"], models["dspark"], n_ctx=256, n_threads=1) as llm:
        assert llm.n_draft == 4 and llm.context.params.n_outputs_max_per_seq == 5
    with load(models["target"], models["dspark"], speculative={"n_max": 2}, n_ctx=256, n_threads=1) as llm:
        assert llm.n_draft == 2 and llm.context.params.n_outputs_max_per_seq == 3
    with pytest.raises(InvalidArgumentError, match="n_outputs_max_per_seq"):
        LLM(models["target"], draft_model_path=models["dspark"], n_outputs_max_per_seq=2, n_ctx=256,
            n_threads=1)


def test_bad_calls(models, target_llm):
    with pytest.raises(TypeError, match="generate_batch"):
        target_llm.generate(["a", "b"])
    with pytest.raises(TypeError, match="unknown sampling option"):
        target_llm.generate("a", temp=0.5)
    with pytest.raises(TypeError, match="stop takes strings"):
        target_llm.generate("a", stop=[[1, 2]])
    with pytest.raises(InvalidArgumentError, match="stop_token_ids"):
        target_llm.generate("a", stop_token_ids=[10**6])
    with pytest.raises(InvalidArgumentError, match="empty"):
        target_llm.generate("")
    with pytest.raises(InvalidArgumentError, match="temperature"):
        target_llm.generate("a", SamplingParams(temperature=-1))
    with LLM(models["bare"], n_ctx=64, n_threads=1) as bare:
        with pytest.raises(InvalidArgumentError, match="no tokenizer"):
            bare.generate("text")


def test_close(models):
    llm = LLM(models["target"], n_ctx=64, n_threads=1)
    llm.close()
    llm.close()
    with pytest.raises(DSparkError, match="closed"):
        llm.generate("a")


def test_sampling_is_reproducible_with_a_seed(bigram_llm):
    a = bigram_llm.generate(PROMPTS[0], max_tokens=20, temperature=0.8, seed=7)
    b = bigram_llm.generate(PROMPTS[0], max_tokens=20, temperature=0.8, seed=7)
    assert a.tokens == b.tokens


def test_import_does_not_load_the_native_library():
    code = ("import sys, dspark_ggml, dspark_ggml.convert; dspark_ggml.SpeculativeConfig; "
            "assert 'cffi' not in sys.modules, 'the native library was loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_confidence_schedule_with_several_sequences_loads_and_is_lossless():
    """The schedule's verify-cost calibration lays its batches out as verify batches (one block per
    sequence), so it fits the per-sequence output limit of a multi-sequence LLM."""
    from tests import tiny_pair as demo

    prompts = ["def f(x):\n", "import os\n"]
    with LLM(demo.TARGET_PATH, n_ctx=512, n_seq_max=2, n_threads=1) as plain:
        expected = [r.tokens for r in plain.generate_batch(prompts, max_tokens=24)]
    with LLM(demo.TARGET_PATH, draft_model_path=demo.DRAFT_PATH, n_ctx=512, n_seq_max=2, n_threads=1,
                speculative={"schedule": "confidence"}) as llm:
        assert [r.tokens for r in llm.generate_batch(prompts, max_tokens=24)] == expected
