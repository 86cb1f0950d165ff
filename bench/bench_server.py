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

from common import print_table, prompt_texts
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
        return ["--demo"] if self.target is None else ["-m", self.target, "-md", str(self.draft)]

    def files(self) -> tuple[str, str]:
        from dspark_ggml import demo

        return (demo.target_path(), demo.DRAFT_PATH) if self.target is None else (self.target, str(self.draft))


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
    cmd = [binary, "-m", target, "-md", draft, "--spec-type", "draft-dspark",
           "--spec-draft-n-max", "8",
           "-np", str(n_slots), "-c", str(n_slots * n_ctx_per_slot), "-t", str(threads), "-tb", str(threads),
           "-fa", "on", "--port", str(port), "--host", "127.0.0.1", "--no-webui", *extra]
    return Server("llama-server+draft", cmd, port)


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


# ---- main -----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per level (default: 4 per client, at least 8)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="compute threads of each server (default: all cores but one, left to HTTP)")
    ap.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server binary to compare with")
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
    args = ap.parse_args()
    if (args.model is None) != (args.model_draft is None):
        ap.error("-m and -md go together")
    pair = Pair(args.model, args.model_draft)
    prompts = prompt_texts(args.prompts, 8)
    n_slots = max(args.concurrency)
    mine, theirs = shlex.split(args.ours_args), shlex.split(args.llama_args)
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
