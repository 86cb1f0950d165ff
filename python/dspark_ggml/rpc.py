"""ggml's RPC backend: devices of other machines, each served by ``dspark-ggml rpc-server``.

``add_rpc_server("host:port")`` adds a server's devices to :func:`dspark_ggml.devices` (named
RPC0, RPC1, ... with type "rpc"); a model then goes there with ``device=`` or spreads its layers
over local and RPC devices with ``tensor_split=``. A server that dies mid-call makes that call
raise :class:`~dspark_ggml.errors.DeviceLostError` instead of hanging; what was placed on RPC
devices is then unusable for the rest of the process (other models keep working).

The protocol has no authentication or encryption: run servers on a trusted network only.
"""
from __future__ import annotations

from typing import Iterable

from . import _lib
from .system import Device, devices


def add_rpc_server(endpoint: str) -> list[Device]:
    """Connect to the rpc-server at ``"host:port"`` and return its devices (as now listed by
    :func:`dspark_ggml.devices`). Adding a server twice adds nothing.

    Raises:
        FileAccessError: the server cannot be reached or does not speak the protocol.
        InvalidArgumentError: ``endpoint`` is not ``host:port``.
        UnsupportedError: this build of ggml has no RPC backend.
    """
    lib = _lib.lib()
    n = lib.dspark_rpc_add_server(str(endpoint).encode())
    if n < 0:
        _lib.check(n)
    return [d for d in devices() if d.type == "rpc" and d.description == endpoint][:n]


def add_rpc_servers(endpoints: str | Iterable[str] | None) -> list[Device]:
    """:func:`add_rpc_server` for each of ``"host:port,host:port"`` or a list of endpoints."""
    if not endpoints:
        return []
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out: list[Device] = []
    for e in items:
        if e.strip():
            out += add_rpc_server(e.strip())
    return out


def serve_rpc(endpoint: str = "127.0.0.1:50052", *, device: int = -1, n_threads: int | None = None) -> None:
    """Serve a local device (``-1``: the CPU) to RPC clients at ``endpoint``; blocks while it serves,
    raises if it cannot start."""
    import os

    threads = n_threads if n_threads is not None else (os.cpu_count() or 1)
    _lib.check(_lib.lib().dspark_rpc_serve(str(endpoint).encode(), int(device), int(threads)))
