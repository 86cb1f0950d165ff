"""A validated request -> the engine requests of its choices: the prompt's tokens, stops, seeds."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..decode_loop import Request
from ..errors import DSparkError
from .errors import bad_request
from .protocol import GenerationRequest, check_prompt_tokens

if TYPE_CHECKING:
    from ..llm import LLM


def prompt_tokens(llm: LLM, req: GenerationRequest) -> list[int]:
    """The prompt's token ids: a text prompt as `generate` reads it (BOS as the model asks, control
    tokens written in it parsed), messages through the GGUF's chat template."""
    try:
        if req.messages is not None:
            tokens = llm.apply_chat_template(req.messages)
        elif isinstance(req.prompt, str):
            tokens = llm.tokenize(req.prompt, add_special=True, parse_special=True)
        else:
            tokens = list(req.prompt or [])
            check_prompt_tokens(tokens, llm.n_vocab)
    except (DSparkError, ValueError) as e:  # no tokenizer, a template that refuses the messages
        raise bad_request(str(e), "messages" if req.messages is not None else "prompt") from e
    if not tokens:
        raise bad_request("the prompt is empty (no tokens)", "prompt")
    if len(tokens) >= llm.n_ctx:
        raise bad_request(f"the prompt has {len(tokens)} tokens; the context holds {llm.n_ctx} "
                          "(prompt and output together)", "prompt")
    return tokens


def choice_requests(llm: LLM, req: GenerationRequest, tokens: list[int]) -> list[Request]:
    """One engine request per choice. With a seed, choice i samples with seed + i: the choices
    differ from each other and each is reproducible."""
    s = req.sampling
    stops = [s.stop] if isinstance(s.stop, str) else list(s.stop or [])
    if stops and llm.tokenizer is None:
        raise bad_request("stop strings need a tokenizer and this model has none", "stop")
    stop_ids = [int(t) for t in (s.stop_token_ids or [])]
    bad = [t for t in stop_ids if not 0 <= t < llm.n_vocab]
    if bad:
        raise bad_request(f"'stop_token_ids' outside the vocabulary: {bad[:8]}", "stop_token_ids")
    out = []
    for i in range(req.n):
        seed = None if s.seed is None else (s.seed + i) % (2**32 - 1)
        out.append(Request(list(tokens), replace(s, seed=seed), stops, stop_ids, i))
    return out
