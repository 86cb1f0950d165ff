"""`dspark-ggml serve` under load: throughput and latency at several concurrencies, with and
without the draft, on the demo pair; optionally the same load against llama.cpp's llama-server.

    python bench/bench_server.py [--concurrency 1 4 16] [--max-tokens 128] [--threads N]
                                 [--llama-server PATH] [--rounds N] [--json OUT.json]
                                 [-m TARGET.gguf -md DRAFT.gguf] [--prompts short|humaneval|FILE.jsonl]

Each level sends ``--requests`` streamed greedy completions (default: 4 per client, at least 8)
from ``concurrency`` clients at once. Per request: TTFT (time to the first text), TPOT (time per
output token after the first); per level: tokens/s summed over the requests and p50/p99 of both.
The pair is the demo's unless -m/-md name another; the prompts are eight one-line code starts
(`short`) unless --prompts names HumanEval's (`humaneval`, the shared set) or a JSONL file.
Servers run with as many slots as the largest concurrency. With --llama-server, the same load goes
to `llama-server -m TARGET -md DRAFT --spec-type draft-dspark -np N -fa on` and the table adds our
throughput as a ratio of its. Flash attention is on on both sides (ours: its default, with
batch-invariant kernels; `--llama-args "-fa off"` runs llama-server without it). Our servers run
their default schedule (adaptive) unless --ours-args says otherwise.

    python bench/bench_server.py --multi-turn [--conversations 8] [--turns 6] [--max-tokens 48]
                                 [--llama-server PATH|auto] [--demo | -m TARGET.gguf [-md DRAFT.gguf]]

The multi-turn chat workload: ``--conversations`` clients at once, each a conversation of ``--turns``
streamed greedy chat turns with a growing history (every turn re-sends the system message, the
earlier user messages and the server's own replies, plus a new user message; the user messages ask
about docstrings of Python's standard library). It runs on `dspark-ggml serve` with the prompt
cache, the same with --no-cache-prompt, and llama-server (its default cache_prompt) on the same
GGUF, slots (one per conversation), context (slots x --ctx-per-slot) and threads. The model is
SmolLM2-135M-Instruct Q4_1 alone unless --demo (the demo pair, llama-server with its draft too)
or -m/-md. The table: per server and turn index the mean prompt and cached tokens (usage.
prompt_tokens_details.cached_tokens; llama-server's timings.cache_n) and TTFT mean/p50/p90, and over
the workload the tokens generated per second of wall time, as ratios to llama-server's.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from common import add_prompts_arg, print_table, prompt_texts
from tests.server_process import HOST, ServerProcess, free_port


@dataclass
class Sample:
    ttft: float
    tpot: float
    tokens: int


@dataclass
class Level:
    server: str
    concurrency: int
    requests: int
    errors: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float


# ---- servers --------------------------------------------------------------------------------------

class Server(ServerProcess):
    """Any server command (ours or llama-server) on a free loopback port, ready once /health answers
    200: tests/server_process.py's readiness wait and log, for a command of our own."""

    def __init__(self, name: str, cmd: list[str], port: int, timeout: float = 180.0) -> None:
        self.name, self.port, self.url, self.api_key = name, port, f"http://{HOST}:{port}", None
        fd, log = tempfile.mkstemp(prefix="bench-server-", suffix=".log")
        self.log_path, self._log = Path(log), os.fdopen(fd, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(timeout)

    def tail(self, n: int = 15) -> str:
        """The last lines of the server's output."""
        return "\n".join(self.log().splitlines()[-n:])

    def close(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after 30 s; the log goes."""
        try:
            self.terminate(30)
        except subprocess.TimeoutExpired:
            pass
        self.log_path.unlink(missing_ok=True)


@dataclass
class Pair:
    """The target and draft GGUFs the servers load (None: the demo pair)."""

    target: str | None = None
    draft: str | None = None

    def ours(self) -> list[str]:
        if self.target is None:
            return ["--demo"]
        return ["-m", self.target] + (["-md", self.draft] if self.draft else [])

    def files(self) -> tuple[str, str | None]:
        from dspark_ggml import demo

        return (demo.target_path(), demo.DRAFT_PATH) if self.target is None else (self.target, self.draft)


def ours(pair: Pair, n_slots: int, threads: int, draft: bool, extra: list[str]) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "dspark_ggml", "serve", *pair.ours(), "--port", str(port), "-np", str(n_slots),
           "-t", str(threads), "--log-level", "warning", "--queue-size", "256", *extra]
    if not draft:
        cmd += ["--spec-type", "none"]
    return Server("dspark-ggml" + ("+draft" if draft else ""), cmd, port)


def llama_server(pair: Pair, binary: str, n_slots: int, threads: int, n_ctx_per_slot: int,
                 extra: list[str]) -> Server:
    target, draft = pair.files()
    port = free_port()
    spec = ["-md", draft, "--spec-type", "draft-dspark", "--spec-draft-n-max", "8"] if draft else []
    cmd = [binary, "-m", target, *spec,
           "-np", str(n_slots), "-c", str(n_slots * n_ctx_per_slot), "-t", str(threads), "-tb", str(threads),
           "-fa", "on", "--port", str(port), "--host", "127.0.0.1", "--no-webui", *extra]
    return Server("llama-server+draft" if draft else "llama-server", cmd, port)


# ---- load -----------------------------------------------------------------------------------------

def one_request(client: httpx.Client, prompt: str, max_tokens: int, chat: bool = False) -> Sample:
    """A streamed greedy completion (a chat completion with `chat`: the prompt is the user's
    message): TTFT, TPOT and the tokens it produced."""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    t0 = time.perf_counter()
    first = last = None
    n_chunks, usage = 0, None
    with client.stream("POST", "/v1/chat/completions" if chat else "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"].get("completion_tokens")
            if any(c.get("text") or (c.get("delta") or {}).get("content") for c in d.get("choices", [])):
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                n_chunks += 1
    tokens = usage if usage else n_chunks
    first = first if first is not None else time.perf_counter()
    last = last if last is not None else first
    return Sample(first - t0, (last - first) / (tokens - 1) if tokens > 1 else 0.0, tokens)


def run_level(server: Server, concurrency: int, n_requests: int, max_tokens: int, prompts: list[str],
              chat: bool = False) -> Level:
    jobs = [prompts[i % len(prompts)] for i in range(n_requests)]
    lock = threading.Lock()
    samples: list[Sample] = []
    errors: list[str] = []

    def worker() -> None:
        # a fresh connection per request: a server may close an idle kept-alive one just as it is reused
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=server.url, timeout=600, limits=fresh) as client:
            while True:
                with lock:
                    if not jobs:
                        return
                    prompt = jobs.pop()
                try:
                    s = one_request(client, prompt, max_tokens, chat)
                except (httpx.HTTPError, ValueError) as e:  # counted, not fatal: the table says how many
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                with lock:
                    samples.append(s)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [s.ttft * 1e3 for s in samples]
    tpot = [s.tpot * 1e3 for s in samples]
    if errors:
        print(f"{server.name} c={concurrency}: {len(errors)} failed requests, e.g. {errors[0]}\n"
              f"{server.tail()}", file=sys.stderr)
    return Level(server.name, concurrency, len(samples), len(errors), sum(s.tokens for s in samples) / wall,
                 _pct(ttft, 50), _pct(ttft, 99), _pct(tpot, 50), _pct(tpot, 99))


def _pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if q < 100 else max(values)


# ---- multi-turn chat ------------------------------------------------------------------------------

# the modules whose docstrings are the chat's user messages: real prose that ships with Python,
# disjoint from the held-out prompt sets in ../shared/data/prompts
DOC_MODULES = ["textwrap", "json", "csv", "heapq", "bisect", "functools", "itertools", "collections",
               "string", "difflib", "fractions", "statistics", "shutil", "tempfile", "glob", "fnmatch",
               "argparse", "logging", "pathlib", "dataclasses", "enum", "contextlib", "random", "queue", "sched",
               "weakref", "copy", "pprint", "zipfile", "tarfile", "gzip", "base64", "hashlib", "hmac", "secrets",
               "uuid", "calendar", "datetime", "decimal", "operator", "inspect", "ast", "tokenize",
               "urllib.parse", "email.utils", "html", "socket", "threading", "subprocess", "sqlite3", "unittest",
               "doctest", "timeit", "traceback"]
ASKS = ["Explain this in plain words:", "Give a short example of what this describes:",
        "What is this useful for?", "Rewrite this more simply:", "Summarize this in one sentence:",
        "What could go wrong when using this?"]
SYSTEM = "You are a helpful assistant. Answer briefly."


def user_messages(n: int) -> list[str]:
    """n user messages: a question on the first paragraph of a docstring of Python's standard
    library (120 to 500 characters), modules taken in turn, members in name order."""
    import importlib
    import inspect

    per_module = []
    for name in DOC_MODULES:
        mod = importlib.import_module(name)
        docs = []
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            if attr.startswith("_") or getattr(obj, "__module__", None) not in (name, mod.__name__):
                continue
            doc = inspect.getdoc(obj) or ""
            para = " ".join(doc.split("\n\n")[0].split())
            if 120 <= len(para) <= 500:
                docs.append(para)
        per_module.append(docs)
    texts, seen = [], set()
    for i in range(max(map(len, per_module))):
        for docs in per_module:
            if i < len(docs) and docs[i] not in seen:
                seen.add(docs[i])
                texts.append(docs[i])
    if len(texts) < n:
        raise SystemExit(f"only {len(texts)} docstrings for {n} messages")
    return [f"{ASKS[i % len(ASKS)]}\n\n{t}" for i, t in enumerate(texts[:n])]


@dataclass
class TurnSample:
    conversation: int
    turn: int  # 1-based
    ttft: float  # seconds
    tokens: int  # generated
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Workload:
    """One run of the multi-turn workload on one server."""

    server: str
    samples: list[TurnSample]
    errors: int
    wall: float  # seconds, first request sent to last reply

    @property
    def tokens_per_s(self) -> float:
        return sum(s.tokens for s in self.samples) / self.wall if self.wall else 0.0


def chat_turn(client: httpx.Client, messages: list[dict], max_tokens: int,
              extra: dict | None = None) -> tuple[float, str, int, int, int]:
    """A streamed greedy chat completion: (TTFT s, reply, completion tokens, prompt tokens, cached
    prompt tokens). The cached count is usage.prompt_tokens_details.cached_tokens, or llama-server's
    timings.cache_n where that is missing."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    ttft, text, usage, timings = None, "", {}, {}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    ttft = ttft if ttft is not None else time.perf_counter() - t0
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", timings.get("cache_n", 0)) or 0
    return ttft, text, usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0), cached


def run_conversations(server: Server, messages: list[str], n_conv: int, n_turns: int, max_tokens: int,
                      extra: dict | None = None) -> Workload:
    """n_conv conversations at once, one client each, of n_turns turns: each turn sends the whole
    conversation so far (system message, the earlier user messages and the server's own replies)
    and a new user message. A failed request ends its conversation (counted in errors)."""
    lock = threading.Lock()
    samples: list[TurnSample] = []
    errors: list[str] = []

    def conversation(i: int) -> None:
        history = [{"role": "system", "content": SYSTEM}]
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=server.url, timeout=600, limits=fresh) as client:
            for t in range(n_turns):
                history.append({"role": "user", "content": messages[t * n_conv + i]})
                try:
                    ttft, reply, tokens, n_prompt, n_cached = chat_turn(client, history, max_tokens, extra)
                except (httpx.HTTPError, ValueError) as e:
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    return
                history.append({"role": "assistant", "content": reply})
                with lock:
                    samples.append(TurnSample(i, t + 1, ttft, tokens, n_prompt, n_cached))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(n_conv)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        print(f"{server.name}: {len(errors)} failed requests, e.g. {errors[0]}\n{server.tail()}", file=sys.stderr)
    return Workload(server.name, samples, len(errors), wall)


def multi_turn(args: argparse.Namespace, pair: Pair, mine: list[str], theirs: list[str]) -> int:
    """The multi-turn chat workload on our server with and without the prompt cache and on
    llama-server (with --llama-server), in turns for --rounds rounds; the table of the median round."""
    n_conv, n_turns = args.conversations, args.turns
    messages = user_messages(n_conv * n_turns)
    n_slots = args.slots or n_conv
    n_ctx = n_slots * args.ctx_per_slot
    draft = pair.draft is not None or pair.target is None
    ctx = ["-c", str(n_ctx)]
    factories = [("dspark-ggml cache", lambda: ours(pair, n_slots, args.threads, draft, ctx + mine)),
                 ("dspark-ggml no-cache", lambda: ours(pair, n_slots, args.threads, draft,
                                                      ctx + ["--no-cache-prompt"] + mine))]
    if args.llama_server:
        factories.append(("llama-server", lambda: llama_server(pair, args.llama_server, n_slots, args.threads,
                                                               args.ctx_per_slot, theirs)))
    extra = {"ignore_eos": True} if args.ignore_eos else None
    runs: dict[str, list[Workload]] = {}
    for r in range(args.rounds):
        for name, make in factories:
            server = make()
            try:
                with httpx.Client(base_url=server.url, timeout=600) as client:  # warm-up, another text
                    chat_turn(client, [{"role": "user", "content": "Say hello."}], 8, extra)
                w = run_conversations(server, messages, n_conv, n_turns, args.max_tokens, extra)
            finally:
                server.close()
            w.server = name
            runs.setdefault(name, []).append(w)
            ttft = statistics.mean([s.ttft for s in w.samples] or [0]) * 1e3
            print(f"round {r + 1} {name}: {w.tokens_per_s:.2f} tokens/s, {sum(s.tokens for s in w.samples)} "
                  f"tokens in {w.wall:.1f} s, TTFT mean {ttft:.0f} ms, "
                  f"{w.errors} errors", file=sys.stderr, flush=True)
    chosen = {name: sorted(ws, key=lambda w: w.tokens_per_s)[len(ws) // 2] for name, ws in runs.items()}
    print(f"{n_conv} conversations x {n_turns} turns, max_tokens {args.max_tokens}, {n_slots} slots, "
          f"context {n_ctx}, {args.threads} threads, {args.rounds} round(s): the median round (by tokens/s)")
    _report_multi_turn(chosen)
    if args.rounds > 1:
        print()
        print_table(["server"] + [f"round {i + 1} tokens/s" for i in range(args.rounds)],
                    [[name] + [round(w.tokens_per_s, 2) for w in ws] for name, ws in runs.items()])
    if args.json:
        dump = {name: [asdict(w) for w in ws] for name, ws in runs.items()}
        Path(args.json).write_text(json.dumps(dump, indent=2))
    return 0 if not any(w.errors for ws in runs.values() for w in ws) else 1


def _report_multi_turn(chosen: dict[str, Workload]) -> None:
    ref = chosen.get("llama-server")

    def ttft_stats(samples: list[TurnSample]) -> tuple[float, float, float]:
        ms = [s.ttft * 1e3 for s in samples]
        return (statistics.mean(ms), _pct(ms, 50), _pct(ms, 90)) if ms else (0.0, 0.0, 0.0)

    rows = []
    for name, w in chosen.items():
        turns = sorted({s.turn for s in w.samples})
        for t in turns + ["all"]:
            ss = [s for s in w.samples if t == "all" or s.turn == t]
            mean, p50, p90 = ttft_stats(ss)
            ref_ss = [s for s in ref.samples if t == "all" or s.turn == t] if ref else []
            ref_mean = ttft_stats(ref_ss)[0] if ref_ss else 0.0
            rows.append([name, t, len(ss), round(statistics.mean(s.prompt_tokens for s in ss)),
                         round(statistics.mean(s.cached_tokens for s in ss)), round(mean), round(p50), round(p90),
                         f"{mean / ref_mean:.2f}x" if ref_mean else "-",
                         sum(s.tokens for s in ss) if t == "all" else "",
                         round(w.tokens_per_s, 2) if t == "all" else "",
                         (f"{w.tokens_per_s / ref.tokens_per_s:.2f}x" if ref and ref.tokens_per_s else "-")
                         if t == "all" else ""])
    print_table(["server", "turn", "requests", "prompt tok", "cached tok", "TTFT mean ms", "TTFT p50 ms",
                 "TTFT p90 ms", "TTFT mean / llama-server's", "generated tok", "tokens/s",
                 "tokens/s / llama-server's"], rows)


# ---- main -----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_prompts_arg(ap)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per level (default: 4 per client, at least 8)")
    ap.add_argument("--max-tokens", type=int, help="tokens per reply (default: 128; --multi-turn: 48)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="compute threads of each server (default: all cores but one, left to HTTP)")
    ap.add_argument("--llama-server", metavar="PATH",
                    help="llama.cpp's llama-server binary to compare with "
                         "(auto: the one bench/llama_cpp_build.py built)")
    ap.add_argument("--ours-args", default="", metavar="ARGS",
                    help="more `dspark-ggml serve` flags, e.g. '--spec-draft-n-max 3'")
    ap.add_argument("--llama-args", default="", metavar="ARGS", help="more llama-server flags")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every server this many times, in turns, and report each level's median "
                         "round (by tokens/s): on a shared machine one round can be noisy")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    ap.add_argument("-m", "--model", help="target GGUF (default: the demo pair)")
    ap.add_argument("-md", "--model-draft", help="draft GGUF, with -m")
    ap.add_argument("--prompts", default="short",
                    help="short (default), a shared set (humaneval, gsm8k, mt-bench, mbpp), or a JSONL file")
    ap.add_argument("--chat", action="store_true",
                    help="send the prompts as chat messages (/v1/chat/completions), as an instruction model wants")
    mt = ap.add_argument_group("multi-turn chat (--multi-turn)")
    mt.add_argument("--multi-turn", action="store_true",
                    help="the multi-turn chat workload instead of the concurrency levels")
    mt.add_argument("--conversations", type=int, default=8, help="conversations at once (default: 8)")
    mt.add_argument("--turns", type=int, default=6, help="turns per conversation (default: 6)")
    mt.add_argument("--slots", type=int, default=0, help="server slots (default: one per conversation)")
    mt.add_argument("--ctx-per-slot", type=int, default=2048,
                    help="context per slot; both servers get slots x this (default: 2048)")
    mt.add_argument("--demo", action="store_true",
                    help="the demo pair (q8_0 target and its draft) instead of SmolLM2 Q4_1 alone")
    mt.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: every reply is --max-tokens long")
    args = ap.parse_args()
    if args.llama_server == "auto":
        from llama_cpp_build import program

        found = program("llama-server")
        if found is None:
            ap.error("no llama-server built: run bench/llama_cpp_build.py")
        args.llama_server = str(found)
    mine, theirs = shlex.split(args.ours_args), shlex.split(args.llama_args)
    if args.multi_turn:
        args.max_tokens = args.max_tokens or 48
        if args.model_draft and not args.model:
            ap.error("-md needs -m")
        if args.demo:
            pair = Pair()
        else:
            from dspark_ggml.models import smollm2_path

            pair = Pair(args.model or str(smollm2_path()), args.model_draft)
        return multi_turn(args, pair, mine, theirs)
    args.max_tokens = args.max_tokens or 128
    if (args.model is None) != (args.model_draft is None):
        ap.error("-m and -md go together")
    pair = Pair(args.model, args.model_draft)
    prompts = prompt_texts(args.prompts, 8)
    n_slots = max(args.concurrency)
    factories = [("dspark-ggml+draft", lambda: ours(pair, n_slots, args.threads, True, mine)),
                 ("dspark-ggml", lambda: ours(pair, n_slots, args.threads, False, mine))]
    if args.llama_server:
        factories.append(("llama-server+draft",
                          lambda: llama_server(pair, args.llama_server, n_slots, args.threads,
                                               args.max_tokens + 256, theirs)))
    runs: dict[tuple[str, int], list[Level]] = {}
    for _ in range(args.rounds):  # servers take turns: a load change on the machine hits them all
        for name, make in factories:
            server = make()
            try:
                one_request(httpx.Client(base_url=server.url, timeout=600), prompts[0], 8, args.chat)  # warm up
                for c in args.concurrency:
                    n = args.requests or max(8, 4 * c)
                    lv = run_level(server, c, n, args.max_tokens, prompts, args.chat)
                    runs.setdefault((name, c), []).append(lv)
                    print(f"{name} c={c}: {lv.tokens_per_s:.1f} tokens/s", file=sys.stderr, flush=True)
            finally:
                server.close()
    # per server and level the round of median throughput
    levels = [sorted(rs, key=lambda lv: lv.tokens_per_s)[len(rs) // 2] for rs in runs.values()]
    _report(levels)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(lv) for lv in levels], indent=2))
    return 0


def _report(levels: list[Level]) -> None:
    print_table(["server", "concurrency", "requests", "errors", "tokens/s", "TTFT p50 ms", "TTFT p99 ms",
                 "TPOT p50 ms", "TPOT p99 ms"],
                [[lv.server, lv.concurrency, lv.requests, lv.errors, lv.tokens_per_s, lv.ttft_p50_ms,
                  lv.ttft_p99_ms, lv.tpot_p50_ms, lv.tpot_p99_ms] for lv in levels])
    by = {(lv.server, lv.concurrency): lv for lv in levels}
    rows = []
    for c in sorted({lv.concurrency for lv in levels}):
        spec, plain, llama = (by.get((name, c)) for name in ("dspark-ggml+draft", "dspark-ggml",
                                                             "llama-server+draft"))
        rows.append([c, _ratio(spec, plain), _ratio(spec, llama), _ratio(llama, spec, "tpot_p50_ms")])
    print()
    print_table(["concurrency", "draft / no draft (tokens/s)", "ours / llama-server (tokens/s)",
                 "llama-server / ours (TPOT p50)"], rows)


def _ratio(a: Level | None, b: Level | None, field: str = "tokens_per_s") -> str:
    if a is None or b is None or not getattr(b, field):
        return "-"
    return f"{getattr(a, field) / getattr(b, field):.2f}x"


if __name__ == "__main__":
    sys.exit(main())
