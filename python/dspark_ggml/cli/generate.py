"""`dspark-ggml generate`: one prompt, streamed to stdout, or one JSON object with --json."""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Union

from .args import (add_model_arguments, add_sampling_arguments, add_speculative_arguments, build_llm,
                       format_stats, sampling_from_args)
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..llm import LLM
    from ..results import GenerationResult
    from ..sampling import SamplingParams

Prompt = Union[str, list[int]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt_text", nargs="?", metavar="PROMPT",
                   help="the prompt (or use -p, -f, --prompt-tokens)")
    g = p.add_argument_group("prompt")
    g.add_argument("-p", "--prompt", metavar="TEXT", help="the prompt")
    g.add_argument("-f", "--file", metavar="FILE", help="read the prompt from a file ('-' = stdin)")
    g.add_argument("--prompt-tokens", metavar="IDS",
                   help="the prompt as comma-separated token ids, e.g. 1,2,3")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as one user message through the chat template")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object (tokens, text, finish_reason, stats) instead of streaming")
    g.add_argument("--logprobs", type=int, metavar="K",
                   help="with --json: each generated token's logprob and its top K (0..20) alternatives")
    add_model_arguments(p)
    add_speculative_arguments(p)
    add_sampling_arguments(p)


def read_prompt(args: argparse.Namespace) -> Prompt:
    """The prompt from exactly one of PROMPT, -p, -f, --prompt-tokens (the demo's own by default).
    With --demo a text prompt is a chat message (the demo target is an instruction model)."""
    prompt = _read_prompt(args)
    if args.demo and isinstance(prompt, str):
        args.chat = True
    return prompt


def _read_prompt(args: argparse.Namespace) -> Prompt:
    sources = ("prompt_text", "prompt", "file", "prompt_tokens")
    given = [name for name in sources if getattr(args, name) is not None]
    if len(given) > 1:
        raise InvalidArgumentError("give the prompt one way only: PROMPT, -p/--prompt, -f/--file or "
                                   "--prompt-tokens")
    if not given:
        if args.demo:
            from ..demo import DEMO_PROMPT

            return DEMO_PROMPT
        raise InvalidArgumentError("no prompt: pass PROMPT, -p/--prompt, -f/--file or --prompt-tokens")
    if args.prompt_tokens is not None:
        if args.chat:
            raise InvalidArgumentError("--chat needs a text prompt, not --prompt-tokens")
        return _parse_token_ids(args.prompt_tokens)
    if args.file is not None:
        if args.file == "-":
            return sys.stdin.read()
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    return args.prompt if args.prompt is not None else args.prompt_text


def _parse_token_ids(text: str) -> list[int]:
    parts = text.replace(" ", "").split(",")
    if parts == [""]:
        raise InvalidArgumentError("--prompt-tokens is empty")
    if "" in parts:  # "1,,2" or "1,2,": a token left out, not to be skipped silently
        raise InvalidArgumentError(f"--prompt-tokens has an empty entry in {text!r}")
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise InvalidArgumentError(f"--prompt-tokens takes comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
    if args.logprobs is not None and not args.json:
        raise InvalidArgumentError("--logprobs needs --json (the streamed text has no place for them)")
    sampling = sampling_from_args(args)
    with build_llm(args) as llm:
        if args.chat:
            prompt = llm.apply_chat_template([{"role": "user", "content": prompt}])
        if args.json:
            result = llm.generate(prompt, sampling)
            print(json.dumps(json_report(llm, result)))
        else:
            _stream(llm, prompt, sampling)
    return 0


def _stream(llm: LLM, prompt: Prompt, sampling: SamplingParams) -> None:
    for chunk in llm.stream(prompt, sampling):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        if chunk.stats is not None:
            sys.stdout.write("\n")
            print(format_stats(chunk.stats, chunk.finish_reason or "", llm.method), file=sys.stderr)


def json_report(llm: LLM, result: GenerationResult) -> dict[str, Any]:
    """The --json object: the result plus what ran it."""
    return {"model": llm.model.path, "draft_model": llm.draft_model.path if llm.draft_model else None,
            "device": llm.model.device, "draft_device": llm.draft_model.device if llm.draft_model else None,
            "devices": llm.model.devices, "draft_devices": llm.draft_model.devices if llm.draft_model else None,
            "method": llm.method, "n_draft": llm.n_draft, **result.to_dict()}
