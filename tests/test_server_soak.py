"""Two minutes of `bench/soak_server.py` (the issue's hour-long soak, shortened) on the tiny pair:
mixed traffic from 8 clients (chat, completions, streams, dropped streams, structured output,
prompt-cache hits and misses, bad requests), then the counts that must come back once the server
is idle. Only counts are checked here (statuses, slots, queue, KV cells, file descriptors): RSS and
latency ratios depend on the machine's load, and the bench prints them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from tests.tiny_pair import DRAFT_PATH, TARGET_PATH  # noqa: E402

SOAK = Path(__file__).resolve().parents[1] / "bench" / "soak_server.py"


def test_two_minutes_of_mixed_load_leave_nothing_behind(tmp_path: Path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(SOAK), "--minutes", "2", "--concurrency", "8", "--window", "0.5", "--sample", "2",
           "--json", str(out), "--log", str(tmp_path / "server.log"), "--",
           "-m", TARGET_PATH, "-md", DRAFT_PATH, "-np", "4", "-t", "1", "-c", "4096"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert out.exists(), res.stdout + res.stderr + log
    r = json.loads(out.read_text())
    v = r["verdicts"]
    assert r["server_alive"] and "server exit status 0" in res.stdout, log
    assert "Traceback" not in log and "internal error" not in log, log
    assert r["requests"] > 100
    assert v["no 5xx, no failed connection"], r["statuses"]
    assert v["bad requests all 4xx"]
    assert v["idle: no slot busy, no queue"], r["idle_after"]
    assert v["idle: KV cells only the prompt cache's"], r["idle_after"]
    assert v["no fd growth at idle"], (r["idle_before"], r["idle_after"])
    assert r["idle_after"]["prompt_cache_cells"] <= 4096
