"""A validated request -> the engine requests of its choices: the prompts' tokens, stops, seeds."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..decode_loop import Request
from ..errors import DSparkError, InvalidArgumentError
from ..structured import TokenConstraint, constraint_for
from .errors import bad_request, exceed_context
from .protocol import GenerationRequest, Prompt, check_prompt_tokens
from .tools import as_plain_messages, template_takes_tools, with_tools

if TYPE_CHECKING:
    from ..llm import LLM
    from ..sampling import SamplingParams


def prompt_tokens(llm: LLM, req: GenerationRequest) -> list[list[int]]:
    """The token ids of each prompt (one for chat): a text prompt as `generate` reads it (BOS as
    the model asks, control tokens written in it parsed), messages through the GGUF's chat template."""
    if req.messages is not None:
        try:
            tokens = _chat_tokens(llm, req)
        except (DSparkError, ValueError) as e:  # no tokenizer, a template that refuses the messages
            raise bad_request(str(e), "messages") from e
        return [_checked(llm, tokens, "the prompt")]
    prompts = req.prompts or []
    return [_checked(llm, tokenize(llm, p, "prompt"), "the prompt" if len(prompts) == 1 else f"prompt[{i}]")
            for i, p in enumerate(prompts)]


def chat_token_count(llm: LLM, req: GenerationRequest) -> int:
    """How many tokens a chat request's prompt takes, however many the context holds."""
    try:
        return len(_chat_tokens(llm, req))
    except (DSparkError, ValueError) as e:
        raise bad_request(str(e), "messages") from e


def _chat_tokens(llm: LLM, req: GenerationRequest) -> list[int]:
    messages, tools = _chat_input(llm, req)
    return llm.tokenizer.encode_chat(messages, tools=tools)  # type: ignore[union-attr]


def chat_text(llm: LLM, req: GenerationRequest) -> str:
    """The text a chat request's messages render to: what /apply-template answers, and what
    _chat_tokens tokenizes (the same messages and tools through the same template)."""
    try:
        messages, tools = _chat_input(llm, req)
        return llm.tokenizer.apply_chat_template(messages, tools=tools)  # type: ignore[union-attr]
    except (DSparkError, ValueError) as e:  # no tokenizer, a template that refuses the messages
        raise bad_request(str(e), "messages") from e


def _chat_input(llm: LLM, req: GenerationRequest) -> tuple[list[dict], list[dict] | None]:
    """The messages (and tools) the GGUF's template renders; with tools, a template that takes
    them renders them, else they are listed in the system prompt (tools.with_tools)."""
    if llm.tokenizer is None:
        raise InvalidArgumentError(f"{llm.model.path} has no tokenizer: chat needs one")
    messages = req.messages or []
    template = llm.tokenizer.chat_template
    if req.tools is not None and template_takes_tools(template):
        return messages, req.tools.tools
    if req.tools is not None:
        return with_tools(messages, req.tools), None
    return as_plain_messages(messages), None


def tokenize(llm: LLM, prompt: Prompt, param: str) -> list[int]:
    """A text (BOS as the model asks, control tokens parsed) or token ids (checked) -> token ids."""
    try:
        if isinstance(prompt, str):
            return llm.tokenize(prompt, add_special=True, parse_special=True)
        tokens = list(prompt)
        check_prompt_tokens(tokens, llm.n_vocab, param)
        return tokens
    except (DSparkError, ValueError) as e:  # no tokenizer
        raise bad_request(str(e), param) from e


def _checked(llm: LLM, tokens: list[int], what: str) -> list[int]:
    if not tokens:
        raise bad_request(f"{what} is empty (no tokens)", "prompt")
    if len(tokens) >= llm.n_ctx:  # as llama-server: a prompt must leave room for one generated token
        raise exceed_context(f"{what} has {len(tokens)} tokens; the context holds {llm.n_ctx} "
                             "(prompt and output together)", len(tokens), llm.n_ctx)
    return tokens


def choice_requests(llm: LLM, req: GenerationRequest, prompts: list[list[int]]) -> list[Request]:
    """One engine request per choice: n per prompt, indexed prompt by prompt (prompt p's choice j
    is choice p * n + j). With a seed, choice j of a prompt samples with seed + j: the choices
    differ from each other, each is reproducible, and a prompt gets the same choices in a batch of
    prompts as alone. Without a seed each choice samples from its own random seed."""
    s = req.sampling
    stops = [s.stop] if isinstance(s.stop, str) else list(s.stop or [])
    if stops and llm.tokenizer is None:
        raise bad_request("stop strings need a tokenizer and this model has none", "stop")
    stop_ids = [int(t) for t in (s.stop_token_ids or [])]
    bad = [t for t in stop_ids if not 0 <= t < llm.n_vocab]
    if bad:
        raise bad_request(f"'stop_token_ids' outside the vocabulary: {bad[:8]}", "stop_token_ids")
    bad = [t for t in (s.logit_bias or {}) if not 0 <= t < llm.n_vocab]
    if bad:
        raise bad_request(f"'logit_bias' has token ids outside the vocabulary (0 .. {llm.n_vocab - 1}): "
                          f"{bad[:8]}", "logit_bias")
    out = []
    for p, tokens in enumerate(prompts):
        for j in range(req.n):
            seed = None if s.seed is None else (s.seed + j) % (2**32 - 1)
            out.append(Request(list(tokens), replace(s, seed=seed), stops, stop_ids, p * req.n + j,
                               _constraint(llm, s)))
    return out


def _constraint(llm: LLM, s: SamplingParams) -> TokenConstraint | None:
    """A choice's own grammar constraint (a response_format or a required tool call), or None;
    a schema the grammar engine refuses is the request's fault."""
    try:
        return constraint_for(llm.tokenizer, s, llm.n_vocab)
    except InvalidArgumentError as e:
        param = "response_format" if s.json_schema is not None else "tool_choice"
        raise bad_request(str(e), param) from e
