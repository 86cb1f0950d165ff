"""Chat templates from the GGUF, rendered as transformers' apply_chat_template renders them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_fixtures as fx  # noqa: E402

from dspark_ggml.tokenizer import ChatTemplateError, Tokenizer, TokenizerError  # noqa: E402

CHATML = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

# Block tags without dashes: the output depends on trim_blocks/lstrip_blocks being set as
# transformers sets them.
LLAMA3 = """\
{{ bos_token }}
{% set ns = namespace(n=0) %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
    {% set ns.n = ns.n + 1 %}
    {{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
    {% if ns.n > 6 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{% endif %}
"""

INST = ("{{ bos_token }}{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{% endif %}"
        "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
        "{% endfor %}")

_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Météo — the weather <now>",
                                           "parameters": _PARAMETERS}}]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Sys"}, {"role": "user", "content": "  spaced  \n"},
     {"role": "assistant", "content": "Réponse: 4 🚀"}, {"role": "user", "content": "中文?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 5,
]


def _hf(tok_object, template: str, **special: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok_object, chat_template=template, **special)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory):
    path = fx.qwen2_gguf(tmp_path_factory.mktemp("chat") / "q.gguf", chat_template=CHATML)
    ref = _hf(fx.qwen2_like(), CHATML, bos_token="<|endoftext|>", eos_token="<|im_end|>",
              pad_token="<|endoftext|>")
    return Tokenizer.from_gguf(path), ref


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_chatml_matches_transformers(qwen, add_generation_prompt: bool, with_tools: bool) -> None:
    tok, ref = qwen
    tools = TOOLS if with_tools else None
    for messages in CONVERSATIONS:
        ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        theirs = ref.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, tools=tools)
        assert ours == theirs


def test_template_kwargs_are_passed(qwen) -> None:
    tok, ref = qwen
    messages = CONVERSATIONS[0]
    ours = tok.apply_chat_template(messages, enable_thinking=False)
    assert ours == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
    assert ours.endswith("<think>\n\n</think>\n\n")


def test_encode_chat_parses_control_tokens(qwen) -> None:
    tok, _ = qwen
    ids = tok.encode_chat(CONVERSATIONS[1])
    assert ids.count(tok.token_to_id("<|im_start|>")) == 3
    assert tok.decode(ids, special=True) == tok.apply_chat_template(CONVERSATIONS[1])


def test_llama3_template_matches_transformers(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(fx.llama3_gguf(tmp_path / "l.gguf", chat_template=LLAMA3))
    ref = _hf(fx.llama3_like(), LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    for messages in CONVERSATIONS:
        for agp in (True, False):
            ours = tok.apply_chat_template(messages, add_generation_prompt=agp)
            assert ours == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
    # trim_blocks dropped the newlines after the block tags; lstrip_blocks their indentation
    rendered = tok.apply_chat_template(CONVERSATIONS[0])
    assert rendered.startswith("<|begin_of_text|>\n    <|start_header_id|>user")
    with pytest.raises(ChatTemplateError, match="Unknown role: tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
    # the template writes BOS and the vocabulary adds one: encode_chat keeps a single BOS
    ids = tok.encode_chat(CONVERSATIONS[0])
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id


def test_spm_template_matches_transformers(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(fx.spm_gguf(tmp_path / "s.gguf", chat_template=INST))
    ref = _hf(fx.spm_reference(), INST, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    messages = [m for m in CONVERSATIONS[3]]
    assert tok.apply_chat_template(messages) == ref.apply_chat_template(messages, tokenize=False,
                                                                        add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="must alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    ids = tok.encode_chat(CONVERSATIONS[0])
    rendered = ref.apply_chat_template(CONVERSATIONS[0], tokenize=False)
    assert ids == ref.encode(rendered, add_special_tokens=False)


def test_missing_template_is_a_clear_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(fx.gpt2_gguf(tmp_path / "g.gguf"))
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template(CONVERSATIONS[0])
    assert isinstance(ChatTemplateError("x"), TokenizerError)
    # an explicit template source still works
    assert tok.apply_chat_template(CONVERSATIONS[0], chat_template="{{ messages[0].content }}") == "Hi there!"


def test_named_templates_and_helpers(tmp_path: Path) -> None:
    fields = {"model": "gpt2", "pre": "gpt-2", **fx.byte_level_gguf_fields(fx.gpt2_like()),
              "chat_template": [{"name": "default", "template": "D{{ strftime_now('%Y') | length }}"},
                                {"name": "tool_use",
                                 "template": "T{{ tools | length }}{{ tools[0] | tojson }}"}]}
    tok = Tokenizer.from_gguf(fx.write_gguf(tmp_path / "n.gguf", "gpt2", fields))
    assert tok.apply_chat_template(CONVERSATIONS[0]) == "D4"
    rendered = tok.apply_chat_template(CONVERSATIONS[0], tools=TOOLS)
    # tojson keeps non-ASCII text and does no HTML escaping
    assert rendered.startswith("T1{") and "Météo" in rendered and "<now>" in rendered
    assert tok.apply_chat_template(CONVERSATIONS[0], chat_template="default") == "D4"


def test_generation_block_and_sandbox(tmp_path: Path) -> None:
    tok = Tokenizer.from_gguf(fx.gpt2_gguf(tmp_path / "g.gguf"))
    gen = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    assert tok.apply_chat_template(CONVERSATIONS[1], chat_template=gen) == "[Be brief.][What is 2+2?]"
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template(CONVERSATIONS[0], chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="does not compile"):
        tok.apply_chat_template(CONVERSATIONS[0], chat_template="{% if %}")


def test_message_normalisation_matches_transformers(qwen) -> None:
    tok, ref = qwen
    template = ("{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ m.tool_calls is defined }}|"
                "{{ m.reasoning_content | default('-') }}|{{ m.thinking | default('-') }}]{% endfor %}")
    messages = [{"role": "user", "content": "q", "tool_calls": None},
                {"role": "assistant", "content": "a", "reasoning": "because"},
                {"role": "assistant", "content": "b", "thinking": "hmm", "tool_calls": [{"name": "f"}]}]
    ours = tok.apply_chat_template(messages, chat_template=template)
    assert ours == ref.apply_chat_template(messages, chat_template=template, tokenize=False,
                                           add_generation_prompt=True)
    assert "[user|q|False|-|-]" in ours and "[assistant|a|False|because|because]" in ours
    assert messages[0]["tool_calls"] is None  # the caller's messages are not modified
