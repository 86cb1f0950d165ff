"""The `dspark-ggml` command line: generate (text and --json), chat over a pipe, convert, info,
--demo, errors, and `python -m dspark_ggml`."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from dspark_ggml import LLM
from dspark_ggml.cli import main
from tests.tiny_models import TargetConfig, write_target

PROMPT = "The quick brown fox"
THREADS = ["-t", "1"]  # tiny models: more threads only add overhead


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_pair):
    d = tmp_path_factory.mktemp("cli")
    write_target(d / "bare.gguf", TargetConfig(with_tokenizer=False), seed=0)
    return {"target": tiny_pair[0], "draft": tiny_pair[1], "bare": str(d / "bare.gguf")}


@pytest.fixture(scope="module")
def llm(models):
    with LLM(models["target"], draft_model_path=models["draft"], n_threads=1) as llm:
        yield llm


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_json_with_prompt_tokens(models, llm, capsys):
    ids = llm.tokenize(PROMPT)
    rc, out, err = _run(capsys, "generate", "-m", models["target"], "-md", models["draft"], *THREADS,
                        "--prompt-tokens", ",".join(map(str, ids)), "-n", "12", "--json", "--spec-schedule", "static")
    assert rc == 0
    d = json.loads(out)  # stdout holds the JSON object and nothing else
    expected = llm.generate(ids, max_tokens=12)
    assert d["tokens"] == expected.tokens and d["text"] == expected.text
    assert d["prompt_tokens"] == ids and d["finish_reason"] == "length"
    assert (d["method"], d["n_draft"]) == ("dspark", 4)
    stats = d["stats"]
    for key in ("n_drafted", "n_accepted", "acceptance_rate", "mean_accepted_length", "tokens_per_second",
                "t_draft_ms", "t_verify_ms", "t_prefill_ms", "acceptance_by_position"):
        assert key in stats, key
    assert stats["n_generated"] == 12 and stats["n_drafted"] > 0


def test_generate_streams_text_and_prints_stats(models, llm, capsys):
    rc, out, err = _run(capsys, "generate", "-m", models["target"], "--spec-draft-model", models["draft"],
                        *THREADS, "-n", "16", PROMPT)
    assert rc == 0
    assert out == llm.generate(PROMPT, max_tokens=16).text + "\n"
    assert "tokens/s" in err and "acceptance rate" in err and "mean accepted length" in err


def test_generate_options_reach_the_library(models, llm, capsys):
    full = llm.generate(PROMPT, max_tokens=20)
    stop = full.text[6:9]
    rc, out, _ = _run(capsys, "generate", "-m", models["target"], "--spec-type", "none", *THREADS, "-n", "20",
                      "--stop", stop, "--temp", "0", "-p", PROMPT, "--json")
    d = json.loads(out)
    assert rc == 0 and d["method"] == "none" and d["draft_model"] is None
    assert d["text"] == full.text[: full.text.find(stop)] and d["finish_reason"] == "stop"
    rc, out, _ = _run(capsys, "generate", "-m", models["target"], *THREADS, "-n", "8", "--chat", PROMPT,
                      "--json")
    assert json.loads(out)["tokens"] == llm.chat([{"role": "user", "content": PROMPT}], max_tokens=8).tokens


def test_generate_errors(models, capsys):
    rc, _, err = _run(capsys, "generate", "-p", "x")
    assert rc == 1 and "-m/--model" in err
    rc, _, err = _run(capsys, "generate", "-m", models["target"], "-p", "x", "--prompt-tokens", "1")
    assert rc == 1 and "one way only" in err
    rc, _, err = _run(capsys, "generate", "-m", models["target"], "-md", models["draft"], "--spec-type",
                      "draft-dflash", *THREADS, "x")
    assert rc == 1 and "DSpark draft" in err


@pytest.mark.parametrize("flags,message", [
    (["-t", "-3"], "-t/--threads must be >= 1, got -3"),
    (["-t", "0"], "-t/--threads must be >= 1, got 0"),
    (["-b", "0"], "-b/--batch-size must be >= 1, got 0"),
    (["-c", "-1"], "-c/--ctx-size must be >= 0, got -1"),
    (["-n", "-5"], "-n/--max-tokens must be >= 1, or -1 for no limit; got -5"),
    (["-n", "0"], "-n/--max-tokens must be >= 1, or -1 for no limit; got 0"),
    (["--temp", "nan"], "temperature must be a finite number >= 0, got nan"),
    (["--temp", "inf"], "temperature must be a finite number >= 0, got inf"),
    (["--top-p", "nan"], "top_p must be in"),
    (["--prompt-tokens", "1,,2"], "--prompt-tokens has an empty entry in '1,,2'"),
    (["--prompt-tokens", "1,2,"], "--prompt-tokens has an empty entry"),
    (["--prompt-tokens", "1,x"], "--prompt-tokens takes comma-separated integers"),
    (["--grammar", "root ::= ("], "invalid GBNF grammar"),
    (["-j", "{oops"], "the JSON schema is not valid JSON"),
    (["--json-schema-file", "/nonexistent/schema.json"], "--json-schema-file: cannot read /nonexistent/schema.json"),
])
def test_generate_names_the_bad_value(models, capsys, flags, message):
    prompt = [] if "--prompt-tokens" in flags else ["-p", "x"]
    rc, out, err = _run(capsys, "generate", "-m", models["target"], *prompt, *flags)
    assert rc == 1 and out == "" and message in err, err


def test_generate_n_minus_one_runs_to_a_full_context(models, capsys):
    rc, out, err = _run(capsys, "generate", "-m", models["bare"], *THREADS, "-c", "16", "-n", "-1",
                        "--prompt-tokens", "1,2,3", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["finish_reason"] == "context_full" and len(d["tokens"]) == 16 - 3 + 1  # the last needs no cell


def test_a_small_context_refuses_a_long_prompt_as_too_long(models, capsys):
    """-c 8 is smaller than a verify block: the block shrinks to fit, and the prompt is what is refused."""
    ids = ",".join(str(5 + i) for i in range(20))
    rc, _, err = _run(capsys, "generate", "-m", models["target"], "-md", models["draft"], *THREADS, "-c", "4",
                      "--prompt-tokens", ids)
    assert rc == 1 and "a prompt of 20 tokens does not fit in n_ctx (4)" in err, err
    rc, out, err = _run(capsys, "generate", "-m", models["target"], "-md", models["draft"], *THREADS, "-c", "4",
                        "--prompt-tokens", "5,6", "-n", "-1", "--json")
    assert rc == 0, err
    assert json.loads(out)["n_draft"] == 3 and len(json.loads(out)["tokens"]) == 4 - 2 + 1


def test_demo_without_its_files(monkeypatch, tmp_path, capsys):
    import dspark_ggml.demo as demo

    monkeypatch.setattr(demo, "DRAFT_PATH", str(tmp_path / "missing.gguf"))
    rc, _, err = _run(capsys, "generate", "--demo", "Hello")
    assert rc == 1 and "demo draft is not installed" in err and "missing.gguf" in err


def test_demo_runs_the_real_pair_through_the_chat_template(capsys):
    """`generate --demo`: SmolLM2 (fetched once, requantized once) with the shipped draft; the prompt
    is a chat message; the text is the target's own greedy answer, drafted with real acceptance."""
    import dspark_ggml.demo as demo

    assert os.path.isfile(demo.DRAFT_PATH)  # shipped with the package
    question = "What is the capital of France? Answer in one sentence."
    # a fixed block, which drafts every step: the draft's acceptance, not the schedule's choice
    rc, out, _ = _run(capsys, "generate", "--demo", "-t", "2", "-n", "32", "--json", "--spec-schedule", "static", question)
    d = json.loads(out)
    assert rc == 0 and d["method"] == "dspark"
    assert "Paris" in d["text"]
    assert d["stats"]["mean_accepted_length"] >= 1.5  # real acceptance (1.75 on this prompt)
    with LLM(demo.target_path(), n_threads=2) as target_only:
        chat = target_only.apply_chat_template([{"role": "user", "content": question}])
        assert target_only.generate(chat, max_tokens=32).tokens == d["tokens"]


def test_chat_in_process(models, llm, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi there\n\nHow are you?\n/exit\nnot read\n"))
    rc, out, _ = _run(capsys, "chat", "-m", models["target"], "-md", models["draft"], *THREADS, "-n", "10",
                      "--system", "Be brief.")
    assert rc == 0
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    first = llm.chat(history, max_tokens=10).text
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "How are you?"}]
    second = llm.chat(history, max_tokens=10).text
    assert out == f"{first}\n{second}\n"


def test_chat_over_a_pipe(models, llm):
    command = [sys.executable, "-m", "dspark_ggml", "chat", "-m", models["target"], *THREADS, "-n", "6"]
    proc = subprocess.run(command, input="Hello\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == llm.chat([{"role": "user", "content": "Hello"}], max_tokens=6).text + "\n"


def test_chat_needs_a_tokenizer(models, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    rc, out, err = _run(capsys, "chat", "-m", models["bare"], *THREADS)
    assert rc == 1 and out == "" and "no tokenizer" in err


def test_help_of_python_m(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dspark_ggml", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    for command in ("generate", "chat", "convert", "info"):
        assert command in proc.stdout


def test_convert_then_info_then_generate(tmp_path, capsys):
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.hf_checkpoints import make_qwen3_target

    hf_dir = make_qwen3_target(tmp_path / "hf")
    out = tmp_path / "q.gguf"
    rc, _, err = _run(capsys, "convert", str(hf_dir), "-o", str(out), "--outtype", "f32", "-q",
                      "--no-progress")
    assert rc == 0 and out.is_file(), err
    rc, text, _ = _run(capsys, "info", str(out), "--json", "--no-tensors")
    assert rc == 0 and json.loads(text)["architecture"] == "qwen3"
    rc, text, _ = _run(capsys, "generate", "-m", str(out), *THREADS, "-n", "4", "--json", "hello")
    assert rc == 0 and len(json.loads(text)["tokens"]) >= 1
    rc, _, err = _run(capsys, "convert", str(hf_dir), "-o", str(out), "-q", "--no-progress")
    assert rc == 1 and "exists" in err  # the converter's own errors come through


def test_generate_with_a_gbnf_grammar_or_a_json_schema(models, tmp_path, capsys):
    """llama-cli's --grammar / --grammar-file / -j / --json-schema-file: the output follows them,
    with the draft on (checked here on the text, not by the grammar engine)."""
    base = ["generate", "-m", models["target"], "-md", models["draft"], *THREADS, "--json"]
    for flags in (["--grammar", 'root ::= "yes" | "no"'], ["--grammar-file", str(_write(tmp_path / "g.gbnf",
                                                                                         'root ::= "yes" | "no"'))]):
        rc, out, err = _run(capsys, *base, "-n", "8", *flags, PROMPT)
        d = json.loads(out)
        assert rc == 0 and d["text"] in ("yes", "no") and d["finish_reason"] == "stop", (d, err)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    rc, out, err = _run(capsys, *base, "-n", "32", "-j", json.dumps(schema), PROMPT)
    d = json.loads(out)
    assert rc == 0 and d["finish_reason"] == "stop", (d, err)
    doc = json.loads(d["text"])
    assert set(doc) == {"n"} and isinstance(doc["n"], int) and 0 <= doc["n"] <= 99


def _write(path, text: str):
    path.write_text(text)
    return path
