"""`dspark-ggml serve` as a subprocess on a free loopback port, for the server tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

HOST = "127.0.0.1"
# flash attention in the servers under test (and the in-process references): DSPARK_TEST_SERVER_FA=on|off
SERVER_FA = {"on": True, "off": False}.get(os.environ.get("DSPARK_TEST_SERVER_FA", ""), "auto")
FA_ARGS = ["-fa", {True: "on", False: "off", "auto": "auto"}[SERVER_FA]]


def read_metrics(http) -> dict[str, float]:
    """GET /metrics (Prometheus text) as {name with labels: value}."""
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """Starts `python -m dspark_ggml serve ARGS --port P` and waits until /health answers 200.

    Its output goes to a log file (a pipe nobody reads could fill up and block the server); the
    log is shown when the server fails to start.
    """

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None,
                 timeout: float = 90.0) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        cmd = [sys.executable, "-m", "dspark_ggml", "serve", "--port", str(self.port),
               "--log-level", "warning", *args, *(["--api-key", api_key] if api_key else [])]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_ready(timeout)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become ready in {timeout} s:\n{self.log()}")

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def running_servers(specs: dict[str, tuple[list[str], str | None]], folder) -> Iterator[dict[str, ServerProcess]]:
    """A module fixture's servers: {name: (args, api key or None)} started in turn (logs in
    folder(name)), yielded, then stopped; each must exit 0 with no request ended in an internal error."""
    started: dict[str, ServerProcess] = {}
    try:
        for name, (args, key) in specs.items():
            started[name] = ServerProcess(args, folder(name) / "server.log", key)
        yield started
    finally:
        logs = {name: (srv.terminate(), srv.log()) for name, srv in started.items()}
    for name, (code, log) in logs.items():
        assert code == 0, log
        assert "Traceback" not in log and "internal error" not in log, f"{name}:\n{log}"


def http_clients(servers: dict[str, ServerProcess], timeout: float = 60.0) -> Iterator[dict[str, httpx.Client]]:
    """An httpx client (with the server's key) per server, closed afterwards."""
    clients = {name: srv.client(timeout=timeout) for name, srv in servers.items()}
    yield clients
    for c in clients.values():
        c.close()


def sse(http, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """(event name, data) of each server-sent event; data is JSON, or "[DONE]"."""
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out
