"""`dspark-ggml chat`: a conversation read from stdin, replies streamed to stdout.

Each line is a user message; the whole history goes through the model's chat template for every
reply. `/exit` (or Ctrl-D) ends the chat, `/reset` forgets the history. Ctrl-C during a reply stops
that reply (what was generated stays in the history); Ctrl-C at the prompt ends the chat. Works
with a pipe as stdin (no prompt marker is printed then).
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .args import (add_model_arguments, add_sampling_arguments, add_speculative_arguments, build_llm,
                       format_stats, sampling_from_args)
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..llm import LLM
    from ..sampling import SamplingParams

Message = dict[str, Any]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    p.add_argument("-v", "--verbose", action="store_true", help="print statistics after each reply (stderr)")
    add_model_arguments(p)
    add_speculative_arguments(p)
    add_sampling_arguments(p)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_from_args(args)
    with build_llm(args) as llm:
        start: list[Message] = [{"role": "system", "content": args.system}] if args.system else []
        # a model without a tokenizer or a chat template fails here, not at every line
        llm.apply_chat_template([*start, {"role": "user", "content": ""}])
        history = list(start)
        interactive = sys.stdin.isatty()
        while True:
            line = _read_line(interactive)
            if line is None or line.strip() in ("/exit", "/quit"):
                break
            text = line.strip()
            if text == "/reset":
                history = list(start)
            elif text:
                history.append({"role": "user", "content": text})
                try:
                    reply = _reply(llm, history, sampling, args.verbose)
                except InvalidArgumentError as e:  # e.g. a message too long for the context
                    history.pop()
                    print(f"dspark-ggml chat: error: {e}", file=sys.stderr)
                    continue
                history.append({"role": "assistant", "content": reply})
    return 0


def _read_line(interactive: bool) -> str | None:
    """The next user line, or None at the end of input (Ctrl-D, end of the pipe, Ctrl-C)."""
    try:
        if interactive:
            return input("> ")
        line = sys.stdin.readline()
        return line if line else None
    except (EOFError, KeyboardInterrupt):
        if interactive:
            print(file=sys.stderr)
        return None


def _reply(llm: LLM, history: list[Message], sampling: SamplingParams, verbose: bool) -> str:
    """Stream the assistant's reply to stdout and return its text."""
    prompt = _fit_history(llm, history)
    parts: list[str] = []
    try:
        for chunk in llm.stream(prompt, sampling):
            parts.append(chunk.text)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.stats is not None and verbose:
                stats_line = format_stats(chunk.stats, chunk.finish_reason or "", llm.method)
                print("\n" + stats_line, file=sys.stderr)
    except KeyboardInterrupt:
        print("\n[reply interrupted]", file=sys.stderr)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(parts)


def _fit_history(llm: LLM, history: list[Message]) -> list[int]:
    """The chat's tokens, dropping the oldest exchanges (never a system message or the last user
    message) until the prompt leaves room in the context for a reply."""
    room = llm.n_ctx // 4
    while True:
        tokens = llm.apply_chat_template(history)
        if len(tokens) + room <= llm.n_ctx:
            return tokens
        first = 1 if history and history[0]["role"] == "system" else 0
        if len(history) - first <= 1:
            if len(tokens) < llm.n_ctx:
                return tokens
            raise InvalidArgumentError(f"the message is {len(tokens)} tokens, more than the context "
                                       f"({llm.n_ctx})")
        del history[first:first + 2]  # the oldest user message and the reply to it
