"""Real vocabularies: llama.cpp's vocab-only GGUFs with the token ids their original
tokenizers produce (models/ggml-vocab-*.gguf{,.inp,.out}), and real chat templates
(models/templates/*.jinja) rendered against transformers, all from the llama-cpp-python
sdist that the native build caches. Skipped only when that archive is not cached yet."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import ChatTemplateError, IncrementalDetokenizer, Tokenizer  # noqa: E402

VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder", "falcon", "deepseek-coder", "command-r",
          "llama-spm", "phi-3", "gemma-4"]
TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct",
             "google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct",
             "mistralai-Mistral-Nemo-Instruct-2407", "HuggingFaceTB-SmolLM3-3B"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    archive = fx.cached_llama_cpp_archive()
    if archive is None:
        pytest.skip("llama-cpp-python sdist not cached (the native build downloads it); "
                    "tests do not download")
    members = [f"models/ggml-vocab-{v}.gguf{ext}" for v in VOCABS for ext in ("", ".inp", ".out")]
    members += [f"models/templates/{t}.jinja" for t in TEMPLATES]
    got = fx.extract_llama_cpp_files(archive, members, tmp_path_factory.mktemp("llama_cpp"))
    assert set(got) == set(members)
    return got


@pytest.fixture(scope="module")
def qwen(files: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_gguf(files["models/ggml-vocab-qwen2.gguf"])


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_matches_reference_ids(files: dict[str, Path], name: str) -> None:
    start = time.perf_counter()
    tok = Tokenizer.from_gguf(files[f"models/ggml-vocab-{name}.gguf"])
    load_s = time.perf_counter() - start
    cases = fx.read_vocab_tests(files[f"models/ggml-vocab-{name}.gguf.inp"],
                                files[f"models/ggml-vocab-{name}.gguf.out"])
    assert len(cases) > 40
    for text, expected in cases:
        ids = tok.encode(text, add_special=False)
        assert ids == expected, repr(text)
        assert tok.decode(ids) == text, repr(text)
        detok = IncrementalDetokenizer(tok)
        assert "".join(detok.add(i) for i in ids) + detok.flush() == text
    assert load_s < 15.0, f"loading {name} took {load_s:.1f} s"


def test_real_vocab_special_tokens(files: dict[str, Path], qwen: Tokenizer) -> None:
    im_end = qwen.token_to_id("<|im_end|>")
    assert qwen.is_eog(im_end) and qwen.is_eog(qwen.token_to_id("<|endoftext|>"))
    assert not qwen.add_bos
    ids = qwen.encode("<|im_start|>hi<|im_end|>", parse_special=True)
    assert ids[::2] == [qwen.token_to_id("<|im_start|>"), im_end]
    llama3 = Tokenizer.from_gguf(files["models/ggml-vocab-llama-bpe.gguf"])
    assert llama3.add_bos and llama3.encode("hi")[0] == llama3.bos_id == 128000
    assert llama3.eot_id == llama3.token_to_id("<|eot_id|>") and llama3.is_eog(llama3.eot_id)
    spm = Tokenizer.from_gguf(files["models/ggml-vocab-llama-spm.gguf"])
    assert spm.encode("Hello")[:1] == [1] and spm.decode(spm.encode("Hello")) == "Hello"
    # gemma4 (space-marked BPE): BOS always added, <turn|> ends generation, "</s>" does not
    gemma = Tokenizer.from_gguf(files["models/ggml-vocab-gemma-4.gguf"])
    assert gemma.model == "gemma4" and gemma.encode("Hi")[0] == gemma.bos_id == 2
    assert gemma.is_eog(gemma.token_to_id("<turn|>")) and gemma.is_eog(gemma.eos_id)
    if gemma.token_to_id("</s>") is not None:
        assert not gemma.is_eog(gemma.token_to_id("</s>"))


MESSAGES = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Und auf Deutsch? 🚀"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Current time",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("template", TEMPLATES)
def test_real_templates_match_transformers(files: dict[str, Path], qwen: Tokenizer, template: str) -> None:
    from transformers import PreTrainedTokenizerFast

    source = files[f"models/templates/{template}.jinja"].read_text(encoding="utf-8")
    tok = qwen
    ref = PreTrainedTokenizerFast(tokenizer_object=fx.qwen2_like(), chat_template=source,
                                  bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    rendered = 0
    for messages in MESSAGES:
        for tools in (None, TOOLS):
            kwargs = {"date_string": "01 Jan 2025"}  # Llama 3.1 would read today's date otherwise
            try:
                theirs = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 tools=tools, **kwargs)
            except Exception as exc:  # the template itself rejects this input: we must reject it too
                with pytest.raises(ChatTemplateError):
                    tok.apply_chat_template(messages, tools=tools, chat_template=source, **kwargs)
                assert type(exc).__name__ in ("TemplateError", "UndefinedError", "TypeError", "ValueError")
                continue
            ours = tok.apply_chat_template(messages, tools=tools, chat_template=source, **kwargs)
            assert ours == theirs
            rendered += 1
    assert rendered >= 2
