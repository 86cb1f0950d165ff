"""ggml's RPC backend: models on an rpc-server at 127.0.0.1, a target split between the CPU and
the server, and servers that are unreachable, not rpc-servers, or die mid-generation.

Each scenario runs in its own process (tests/rpc_scenarios.py says why); these tests check what
it reports. The local run is the reference: RPC moves tensors, not math, so greedy tokens must be
the same in every placement.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dspark_ggml import _lib

from tests import tiny_pair
from tests.server_process import free_port

SCENARIOS = Path(__file__).with_name("rpc_scenarios.py")

pytestmark = pytest.mark.skipif(
    "RPC" not in (_lib.to_str(_lib.lib().dspark_system_info()) or ""), reason="this ggml build has no RPC backend")


def run_scenario(name: str, timeout: float = 180.0) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(SCENARIOS), name, str(free_port())], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"scenario {name} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def placements() -> dict[str, Any]:
    return run_scenario("same")


@pytest.mark.parametrize("name", ["both_on_rpc", "target_split", "draft_on_rpc"])
def test_greedy_tokens_are_the_local_ones(placements: dict[str, Any], name: str) -> None:
    local = placements["local"]
    assert placements[name]["tokens"] == local["tokens"]
    assert placements[name]["reduced"] == local["reduced"]  # reduced-vocab draft, d2t scatter
    # and speculation stayed lossless on RPC: the target alone says the same
    assert local["tokens"] == placements["target_only"]


def test_attention_on_the_server_agrees_with_the_cpus(placements: dict[str, Any]) -> None:
    """Two interleaved sequences past 150 cells of a random f32 target: attention in sequence order
    on the RPC device against our CPU attention node (logits within float rounding: 3e-6 measured;
    a sequence seeing the other's cells would move them by O(1))."""
    import numpy as np

    local, rpc = (np.array(placements["logits"][k]) for k in ("local", "rpc"))
    assert local.shape == rpc.shape == (24, local.shape[1])
    assert np.abs(local - rpc).max() < 1e-4


def test_models_went_where_asked(placements: dict[str, Any]) -> None:
    rpc = f"RPC{0}"
    assert placements["local"]["devices"] == ["CPU"]
    assert placements["both_on_rpc"]["devices"] == [rpc] and placements["both_on_rpc"]["draft_devices"] == [rpc]
    assert placements["target_split"]["devices"] == ["CPU", rpc]
    assert placements["target_split"]["draft_devices"] == ["CPU"]
    assert placements["draft_on_rpc"]["devices"] == ["CPU"]
    assert placements["draft_on_rpc"]["draft_devices"][0] == rpc


def test_a_server_that_dies_mid_generation_is_an_error_not_a_hang() -> None:
    r = run_scenario("dies", timeout=120)
    assert r.get("error") == "DeviceLostError", r
    assert "RPC server was lost" in r["message"]
    assert r["seconds"] < 20
    # what was on the lost server refuses further work at once, naming why
    assert "RPC server was lost" in r["again"]
    # and the process goes on: local models work, the lost device is still listed
    assert r["local_tokens"] > 0
    assert ["RPC0", "rpc"] in r["devices"]


def test_unusable_servers_and_splits_are_refused_clearly() -> None:
    r = run_scenario("refused", timeout=120)
    assert r["nothing_listens"].startswith("FileAccessError: cannot connect to the RPC server at 127.0.0.1:")
    assert "not host:port" in r["no_port"] and "not host:port" in r["bad_port"]
    assert r["not_rpc"].startswith("FileAccessError: the server at 127.0.0.1:")
    assert "does not answer as an rpc-server" in r["not_rpc"]
    assert "tensor_split[1] = -1" in r["split_negative"]
    assert "tensor_split[15] is set but there are only" in r["split_no_device"]
    assert "at most 16 devices" in r["split_too_long"]
    assert r["still_works"] == "4"


def _generate_cli(*extra: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "dspark_ggml", "generate", "-m", tiny_pair.TARGET_PATH, "-md", tiny_pair.DRAFT_PATH, "-n", "32", "--json",
                           "--prompt", "def fibonacci(n):", *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_cli_rpc_and_tensor_split() -> None:
    from tests.rpc_scenarios import rpc_server

    port = free_port()
    server = rpc_server(port)
    try:
        info = subprocess.run([sys.executable, "-m", "dspark_ggml", "info", "--rpc", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)
        assert info.returncode == 0, info.stderr
        assert f"RPC0 (rpc, 127.0.0.1:{port}" in info.stdout
        local = _generate_cli("--device", "0")
        split = _generate_cli("--rpc", f"127.0.0.1:{port}", "--device", "0", "-ts", "1,1")
    finally:
        server.kill()
    assert split["tokens"] == local["tokens"]
    assert split["devices"] == ["CPU", "RPC0"] and local["devices"] == ["CPU"]


def test_server_on_rpc_reports_a_lost_device(tmp_path) -> None:
    """`serve --rpc`: requests run on the RPC device; when its server dies, the request in flight
    and later ones fail with a 500 naming the loss, /health turns 503, and SIGTERM still exits."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from dspark_ggml import devices
    from tests.rpc_scenarios import rpc_server
    from tests.server_process import ServerProcess

    port = free_port()
    rpc = rpc_server(port)
    server = None
    try:
        rpc_index = len(devices())  # RPC0 comes after this process's local devices
        server = ServerProcess(["-m", tiny_pair.TARGET_PATH, "-md", tiny_pair.DRAFT_PATH, "--rpc", f"127.0.0.1:{port}", "--device", str(rpc_index), "-np", "2"],
                               tmp_path / "server.log")
        body = {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0}
        with server.client() as c:
            assert c.post("/v1/completions", json=body).status_code == 200
            rpc.kill()
            rpc.wait(10)
            failed = c.post("/v1/completions", json=body)
            assert failed.status_code == 500
            assert "RPC server was lost" in failed.json()["error"]["message"]
            health = c.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "error"
        assert server.terminate() == 0
    finally:
        rpc.kill()
        if server is not None:
            server.stop()
