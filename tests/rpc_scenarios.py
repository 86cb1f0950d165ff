"""RPC scenarios, each run in a process of its own by tests/test_rpc.py.

Once an RPC server is added, every C API call of the process runs on worker threads, and a lost
server leaves its devices unusable for the rest of the process: neither may leak into the other
tests, so each scenario is a fresh `python tests/rpc_scenarios.py NAME PORT`, printing one JSON
object on its last line.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark_ggml as dg  # noqa: E402
from tests import tiny_pair as demo  # noqa: E402
from tests.tiny_models import TargetConfig, write_target  # noqa: E402

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, x):"]


def rpc_server(port: int) -> subprocess.Popen[bytes]:
    """`dspark-ggml rpc-server` on 127.0.0.1:port, once it accepts connections."""
    proc = subprocess.Popen([sys.executable, "-m", "dspark_ggml", "rpc-server", "-p", str(port), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            # that probe was the server's one client; let it see the close before the real one
            time.sleep(0.2)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("rpc-server did not start")


def devices_of(port: int) -> tuple[int, int]:
    """(the CPU's index, the RPC device's index) once the server is added."""
    rpc = dg.add_rpc_server(f"127.0.0.1:{port}")
    cpu = next(d.index for d in dg.devices() if d.type == "cpu")
    return cpu, rpc[0].index


def tokens(llm: dg.LLM, n: int = 40) -> list[list[int]]:
    return [r.tokens for r in llm.generate_batch(PROMPTS, max_tokens=n, temperature=0.0)]


def interleaved_logits(path: Path, device: int) -> list[list[float]]:
    """Logits of two sequences decoded together: 150-token prompts, then 12 steps of both. On the
    RPC device attention runs in sequence order (dspark_graph::attention_in_order), on the CPU as
    our attention node: two implementations whose rows should agree to float rounding."""
    import numpy as np

    model = dg.Model(path, device=device)
    ctx = dg.Context(model, n_ctx=512, n_seq_max=2, n_batch=256, n_threads=1, type_kv="f32")
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, 256, 150)] for _ in range(2)]
    ctx.decode(prompts[0][:80], seq_ids=0)
    ctx.decode(prompts[1], seq_ids=1)  # its cells after the first 80 of sequence 0's
    ctx.decode(prompts[0][80:], seq_ids=0)
    rows = []
    for i in range(12):
        ctx.decode([int(rng.integers(0, 256)), int(rng.integers(0, 256))], positions=[150 + i, 150 + i],
                   seq_ids=[0, 1], outputs=[True, True])
        rows += ctx.get_logits(copy=True).tolist()
    ctx.close()
    model.close()
    return rows


def same(port: int) -> dict[str, Any]:
    """Greedy tokens of every placement, and where each model went."""
    srv = rpc_server(port)
    try:
        cpu, rpc = devices_of(port)
        placements: dict[str, dict[str, Any]] = {
            "local": dict(device=cpu),
            "both_on_rpc": dict(device=rpc),
            "target_split": dict(device=cpu, tensor_split=[1 if i in (cpu, rpc) else 0 for i in range(rpc + 1)],
                                 draft_device=cpu),
            "draft_on_rpc": dict(device=cpu, draft_device=rpc),
        }
        out: dict[str, Any] = {"rpc_index": rpc}
        for name, kw in placements.items():
            with dg.LLM(demo.TARGET_PATH, draft_model_path=demo.DRAFT_PATH, n_seq_max=2, **kw) as llm:
                out[name] = {"tokens": tokens(llm), "devices": llm.model.devices,
                             "draft_devices": llm.draft_model.devices}
            with dg.LLM(demo.TARGET_PATH, draft_model_path=demo.DRAFT_REDUCED_PATH, n_seq_max=2, **kw) as llm:
                out[name]["reduced"] = tokens(llm)
        with dg.LLM(demo.TARGET_PATH, n_seq_max=2, device=cpu) as llm:
            out["target_only"] = tokens(llm)
        with tempfile.TemporaryDirectory() as d:
            # a random f32 target: rounding stays rounding there (the trained demo amplifies it)
            path = Path(d) / "t.gguf"
            write_target(path, TargetConfig(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64,
                                            n_ff=512, with_tokenizer=False), seed=3)
            out["logits"] = {"local": interleaved_logits(path, cpu), "rpc": interleaved_logits(path, rpc)}
        return out
    finally:
        srv.kill()


def dies(port: int) -> dict[str, Any]:
    """Kill the server during a long generation: the call must fail, not hang or end the process."""
    srv = rpc_server(port)
    _, rpc = devices_of(port)
    llm = dg.LLM(demo.TARGET_PATH, draft_model_path=demo.DRAFT_PATH, device=rpc, n_ctx=8192)
    threading.Timer(0.5, srv.kill).start()
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 30:  # generations (of any length) until the server goes
            llm.generate("def f(x):", max_tokens=400)
    except dg.DSparkError as e:
        out["error"], out["message"] = type(e).__name__, str(e)
    out["seconds"] = time.monotonic() - t0
    try:
        llm.generate("x", max_tokens=4)
    except dg.DSparkError as e:
        out["again"] = str(e)
    llm.close()  # must return: what is on the lost server is left alone
    with dg.LLM(demo.TARGET_PATH, device=next(d.index for d in dg.devices() if d.type == "cpu")) as local:
        out["local_tokens"] = len(local.generate("def f(x):", max_tokens=8).tokens)
    out["devices"] = [(d.name, d.type) for d in dg.devices()]
    return out


def refused(port: int) -> dict[str, Any]:
    """Servers that cannot be used: each a clear error, and the process goes on."""
    out: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            out[name] = "no error"
        except dg.DSparkError as e:
            out[name] = f"{type(e).__name__}: {e}"

    attempt("nothing_listens", lambda: dg.add_rpc_server(f"127.0.0.1:{port}"))
    attempt("no_port", lambda: dg.add_rpc_server("127.0.0.1"))
    attempt("bad_port", lambda: dg.add_rpc_server("127.0.0.1:99999"))
    # a server that accepts and hangs up: not an rpc-server
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)

        def hang_up() -> None:
            while True:
                c, _ = s.accept()
                c.recv(16)
                c.close()

        threading.Thread(target=hang_up, daemon=True).start()
        attempt("not_rpc", lambda: dg.add_rpc_server(f"127.0.0.1:{s.getsockname()[1]}"))
    attempt("split_negative", lambda: dg.Model(demo.TARGET_PATH, tensor_split=[1, -1]))
    attempt("split_no_device", lambda: dg.Model(demo.TARGET_PATH, tensor_split=[0] * 15 + [1]))
    attempt("split_too_long", lambda: dg.Model(demo.TARGET_PATH, tensor_split=[1] * 17))
    with dg.LLM(demo.TARGET_PATH) as llm:
        out["still_works"] = str(len(llm.generate("x", max_tokens=4).tokens))
    return out


if __name__ == "__main__":
    scenario, port = sys.argv[1], int(sys.argv[2])
    result = {"same": same, "dies": dies, "refused": refused}[scenario](port)
    print(json.dumps(result))
