"""The prompt cache's time to the first token: `dspark-ggml serve` with and without it
(``--no-cache-prompt``), on a long chat prompt sent again, with a new question, and over a few turns.

    python bench/bench_prompt_cache.py [--lines 120] [--turns 3] [--threads N] [-m TARGET.gguf [-md DRAFT.gguf]]

The prompt is a system message of ``--lines`` numbered lines (120: about 2,600 SmolLM2 tokens) and a
question; each request is a streamed greedy chat completion of 8 tokens, timed to its first text.
Rows: the first request (a full prefill on both servers), the same request again, the same system
message with another question, then ``--turns`` chat turns, each re-sending the conversation with
the last reply and a new question. Columns: prompt tokens, the tokens the cache served
(usage.prompt_tokens_details.cached_tokens), and TTFT with and without the cache; the replies must
be the same on both servers. The model is SmolLM2-135M-Instruct (target only) unless -m/-md say.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import httpx

from bench_server import Server
from common import print_table
from tests.server_process import free_port


def serve(model: list[str], threads: int, cache: bool) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "dspark_ggml", "serve", *model, "--port", str(port), "-np", "2", "-c", "8192",
           "-t", str(threads), "--log-level", "warning", *([] if cache else ["--no-cache-prompt"])]
    return Server("cached" if cache else "uncached", cmd, port)


def first_token(client: httpx.Client, messages: list[dict]) -> tuple[float, str, int, int]:
    """TTFT in seconds, the reply, prompt tokens and cached tokens of one streamed chat request."""
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, ttft, text, usage = time.perf_counter(), None, "", {}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = c.get("delta", {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return ttft or float("nan"), text, usage.get("prompt_tokens", 0), details.get("cached_tokens", 0)


def run(server: Server, lines: int, turns: int) -> list[tuple[str, float, str, int, int]]:
    """The workload's rows: (label, TTFT, reply, prompt tokens, cached tokens)."""
    doc = "".join(f"Line {i}: the quick brown fox number {i} jumps over lazy dog {i * 7 % 13}.\n" for i in range(lines))
    system = {"role": "system", "content": "Answer briefly.\n" + doc}
    question = [system, {"role": "user", "content": "Which line mentions fox 42?"}]
    rows = []
    with httpx.Client(base_url=server.url, timeout=600) as client:
        def send(label: str, messages: list[dict]) -> str:
            ttft, text, n_prompt, n_cached = first_token(client, messages)
            rows.append((label, ttft, text, n_prompt, n_cached))
            return text

        send("first", question)
        reply = send("same again", question)
        send("new question", [system, {"role": "user", "content": "How many lines are there?"}])
        chat = list(question)
        for turn in range(turns):
            chat += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And fox {turn * 10 + 3}?"}]
            reply = send(f"turn {turn + 2}", chat)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=120)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("-m", dest="target")
    ap.add_argument("-md", dest="draft")
    args = ap.parse_args()
    if args.target is None:
        from dspark_ggml.models import smollm2_path

        args.target = str(smollm2_path())
    model = ["-m", args.target] + (["-md", args.draft] if args.draft else [])
    results = {}
    for cache in (True, False):
        server = serve(model, args.threads, cache)
        try:
            results[cache] = run(server, args.lines, args.turns)
        finally:
            server.close()
    table = []
    for (label, t_on, text_on, n, cached), (_, t_off, text_off, _, _) in zip(results[True], results[False]):
        table.append((label, n, cached, t_on, t_off, "yes" if text_on == text_off else "NO"))
    print_table(["request", "prompt tokens", "cached", "TTFT cached (s)", "TTFT uncached (s)", "same reply"], table)
    return 0 if all(r[-1] == "yes" for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
