"""`dspark-ggml rpc-server`: lend this machine's device to dspark-ggml (or llama.cpp) on others.

The same server as llama.cpp's `rpc-server` (ggml's RPC backend, protocol of the linked ggml):
clients name it with `--rpc HOST:PORT`. It serves one client at a time, without authentication
or encryption: bind it to a trusted network only.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1; 0.0.0.0 exposes the device to the network)")
    p.add_argument("-p", "--port", type=int, default=50052, help="port (default: 50052)")
    p.add_argument("-d", "--device", type=int, default=-1, metavar="INDEX",
                   help="local device index to serve (see `dspark-ggml info --system`); -1 = the CPU (default)")
    p.add_argument("-t", "--threads", dest="n_threads", type=int, metavar="N",
                   help="CPU threads (default: all hardware threads)")


def run(args: argparse.Namespace) -> int:
    from ..rpc import serve_rpc

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {args.host}: anyone who can reach this port can use the device "
              "(the RPC protocol has no authentication)", file=sys.stderr)
    # the server loop runs in C and never returns to Python: let Ctrl-C and SIGTERM end the process
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    serve_rpc(f"{args.host}:{args.port}", device=args.device, n_threads=args.n_threads or os.cpu_count())
    return 1
