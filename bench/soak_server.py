"""The server under mixed load for a long time: does anything leak or drift?

    python bench/soak_server.py [--minutes 60] [--concurrency 16] [--window 10] [--json OUT]
                                [-m TARGET.gguf -md DRAFT.gguf | --demo] [-- extra serve args]

Starts `dspark-ggml serve` (the demo pair by default), then `--concurrency` clients send, for
`--minutes`, a mix of requests: chat completions, completions, streamed chat, streams the client
drops after a few chunks, structured output (a JSON schema), prompts repeated from a small pool
(prompt-cache hits) and fresh ones (misses), and bad requests (which must be 4xx). Every
`--sample` seconds it reads the server's RSS and open file descriptors (/proc) and /metrics.

Printed: the first and the last `--window` minutes side by side (RSS, fds, KV cells in use, prompt
cache cells, request latency p50 / p99), the count of each status, and whether the server stayed
up; then, once idle, whether every count came back: no slot busy, no queue, the KV cells in use
no more than the idle slots hold. `--json` writes the same as one object (the test suite runs a
two-minute soak through it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

HOST = "127.0.0.1"
TOPICS = ["prime numbers", "a binary search", "the water cycle", "sorting a list", "a linked list",
          "recursion", "the speed of light", "a hash map", "photosynthesis", "matrix multiplication"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


# ---- the server ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(serve_args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "dspark_ggml", "serve", "--port", str(port), "--log-level", "warning", *serve_args]
    proc = subprocess.Popen(cmd, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not become ready in 180 s")


def process_sample(pid: int) -> dict[str, int]:
    """RSS (KiB) and open file descriptors of a process, from /proc."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return {"rss_kib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def read_metrics(http: httpx.Client) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("dspark_")] = float(value)
    return out


# ---- the traffic --------------------------------------------------------------------------------------

def _prompt(rng: random.Random, fresh: bool) -> str:
    topic = rng.choice(TOPICS)
    tail = f" (note {rng.randrange(10**9)})" if fresh else ""
    return f"Explain {topic} in two sentences.{tail}"


def one_request(http: httpx.Client, rng: random.Random) -> tuple[str, int]:
    """Send one request of a random kind: (kind, HTTP status; 0 if the connection failed)."""
    kind = rng.choice(["chat", "completion", "stream", "dropped_stream", "structured", "bad"])
    fresh = rng.random() < 0.5  # half the prompts are new, half repeat (prompt-cache hits)
    msg = [{"role": "user", "content": _prompt(rng, fresh)}]
    n = rng.randint(8, 48)
    try:
        if kind == "chat":
            return kind, http.post("/v1/chat/completions", json={"messages": msg, "max_tokens": n}).status_code
        if kind == "completion":
            body = {"prompt": _prompt(rng, fresh), "max_tokens": n, "temperature": rng.choice([0.0, 0.8]),
                    "seed": rng.randrange(1000)}
            return kind, http.post("/v1/completions", json=body).status_code
        if kind in ("stream", "dropped_stream"):
            with http.stream("POST", "/v1/chat/completions",
                             json={"messages": msg, "max_tokens": n, "stream": True}) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if kind == "dropped_stream" and i >= 3:
                        break  # the client goes away mid-stream
                return kind, r.status_code
        if kind == "structured":
            fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
            body = {"messages": [{"role": "user", "content": "Invent a person."}], "max_tokens": 48,
                    "response_format": fmt}
            return kind, http.post("/v1/chat/completions", json=body).status_code
        bad = rng.choice([{"messages": msg, "max_tokens": -5}, {"messages": "not a list"},
                          {"prompt": "x", "temperature": "hot"}, {"messages": msg, "n": 0}])
        path = "/v1/completions" if "prompt" in bad else "/v1/chat/completions"
        return kind, http.post(path, json=bad).status_code
    except httpx.HTTPError:
        return kind, 0


def client_loop(url: str, seed: int, stop_at: float, log: list, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=300.0) as http:
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            kind, status = one_request(http, rng)
            with lock:
                log.append((t0, time.monotonic() - t0, kind, status))


# ---- the report ---------------------------------------------------------------------------------------

def window_stats(samples: list[dict], requests: list[tuple], t_lo: float, t_hi: float) -> dict[str, float]:
    """Means of the samples and latency percentiles of the good requests started in [t_lo, t_hi)."""
    rows = [s for s in samples if t_lo <= s["t"] < t_hi] or samples[-1:]
    lat = sorted(d for t, d, kind, status in requests if t_lo <= t < t_hi and status == 200)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0)
    return {"rss_mib": statistics.mean(r["rss_kib"] for r in rows) / 1024,
            "fds": max(r["fds"] for r in rows),
            "kv_cells_used": max(r["kv_cells_used"] for r in rows),
            "prompt_cache_cells": max(r["prompt_cache_cells"] for r in rows),
            "requests": len(lat), "p50_s": pct(0.50), "p99_s": pct(0.99)}


def idle_state(http: httpx.Client, pid: int, settle_fds: int | None = None,
               timeout: float = 120.0) -> dict[str, float]:
    """The server's counts once no request runs or waits (and, with settle_fds, once the sockets the
    clients closed are closed on the server's side too, or the timeout has passed)."""
    deadline = time.monotonic() + timeout
    while True:
        m = read_metrics(http)
        proc = process_sample(pid)
        idle = m["slots_busy"] == 0 and m["queue_depth"] == 0
        if (idle and (settle_fds is None or proc["fds"] <= settle_fds)) or time.monotonic() > deadline:
            return {**proc, **{k: m[k] for k in ("slots_busy", "queue_depth", "kv_cells_used",
                                                 "prompt_cache_cells", "slots_cached")}}
        time.sleep(0.5)


def soak(url: str, pid: int, minutes: float, concurrency: int, window_min: float, sample_s: float) -> dict:
    with httpx.Client(base_url=url, timeout=60.0) as http:
        # one of each kind first, so that lazily made things (compiled grammars, graphs) exist
        warm_rng = random.Random(0)
        for _ in range(12):
            one_request(http, warm_rng)
        before = idle_state(http, pid)
        start = time.monotonic()
        stop_at = start + minutes * 60
        log: list[tuple] = []
        lock = threading.Lock()
        threads = [threading.Thread(target=client_loop, args=(url, 1000 + i, stop_at, log, lock), daemon=True)
                   for i in range(concurrency)]
        for t in threads:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads):
            m = read_metrics(http)
            samples.append({"t": time.monotonic(), **process_sample(pid), "kv_cells_used": m["kv_cells_used"],
                            "prompt_cache_cells": m["prompt_cache_cells"]})
            time.sleep(sample_s)
        for t in threads:
            t.join()
        after = idle_state(http, pid, settle_fds=before["fds"], timeout=60.0)
    w = min(window_min * 60, minutes * 60 / 2)
    first = window_stats(samples, log, start, start + w)
    last = window_stats(samples, log, stop_at - w, stop_at + 1e9)
    statuses = Counter(status for _, _, _, status in log)
    bad_ok = all(400 <= status < 500 for _, _, kind, status in log if kind == "bad")
    return {"minutes": minutes, "concurrency": concurrency, "window_minutes": w / 60, "requests": len(log),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "bad_requests_all_4xx": bad_ok,
            "first": first, "last": last, "idle_before": before, "idle_after": after}


def verdicts(r: dict) -> dict[str, bool]:
    """The issue's goals, one by one."""
    f, l, b, a = r["first"], r["last"], r["idle_before"], r["idle_after"]
    return {"no 5xx, no failed connection": not any(k == "0" or k.startswith("5") for k in r["statuses"]),
            "bad requests all 4xx": r["bad_requests_all_4xx"],
            "RSS last <= 1.1x first": l["rss_mib"] <= 1.1 * f["rss_mib"],
            "no fd growth at idle": a["fds"] <= b["fds"],
            "idle: no slot busy, no queue": a["slots_busy"] == 0 and a["queue_depth"] == 0,
            "idle: KV cells only the prompt cache's": a["kv_cells_used"] <= a["prompt_cache_cells"],
            "p99 last <= 1.2x first": l["p99_s"] <= 1.2 * f["p99_s"]}


def print_report(r: dict, alive: bool) -> None:
    f, l = r["first"], r["last"]
    print(f"{r['minutes']:g} minutes at c{r['concurrency']}: {r['requests']} requests, statuses {r['statuses']}; "
          f"server {'up' if alive else 'DOWN'}")
    print(f"| | first {r['window_minutes']:g} min | last {r['window_minutes']:g} min |\n|---|---|---|")
    for key in ("rss_mib", "fds", "kv_cells_used", "prompt_cache_cells", "requests", "p50_s", "p99_s"):
        fmt = (lambda v: f"{v:.2f}") if isinstance(f[key], float) else str
        print(f"| {key} | {fmt(f[key])} | {fmt(l[key])} |")
    print(f"idle before: {r['idle_before']}\nidle after:  {r['idle_after']}")
    for goal, ok in verdicts(r).items():
        print(f"  {'ok  ' if ok else 'FAIL'} {goal}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--window", type=float, default=10.0, help="minutes compared at the start and the end")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--json", type=Path, help="write the report here too")
    ap.add_argument("--log", type=Path, default=Path("soak_server.log"), help="the server's output")
    args, serve_args = ap.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"] or ["--demo", "-np", str(min(args.concurrency, 16))]
    proc, url = start_server(serve_args, args.log)
    try:
        report = soak(url, proc.pid, args.minutes, args.concurrency, args.window, args.sample)
        alive = proc.poll() is None
        report["server_alive"] = alive
        report["verdicts"] = verdicts(report)
        print_report(report, alive)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            report_code = proc.wait(60)
            print(f"server exit status {report_code}")
    return 0 if alive and all(report["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
