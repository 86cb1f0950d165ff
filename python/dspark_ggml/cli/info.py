"""`dspark-ggml info FILE.gguf`: architecture, hyperparameters, tensor table and sizes."""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ..gguf_file import GGUFFile, TensorInfo


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE.gguf", help="GGUF files to describe")
    p.add_argument("--system", action="store_true", help="also print the ggml build and its devices")
    p.add_argument("--json", action="store_true", help="print one JSON object per file")
    p.add_argument("--no-tensors", action="store_true", help="omit the tensor table")
    from .args import add_rpc_argument

    add_rpc_argument(p)


def _short(value: Any, limit: int = 8) -> Any:
    """Long arrays (vocabularies, merges) are summarised, not printed."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list) and len(value) > limit:
        return f"[{', '.join(map(repr, value[:limit]))}, ...] ({len(value)} items)"
    return value


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def describe(path: str) -> dict[str, Any]:
    with GGUFFile(path) as f:
        tensors = list(f.tensors())
        meta = f.metadata
        return {
            "path": path,
            "gguf_version": f.version,
            "file_size": f.file_size,
            "architecture": meta.get("general.architecture"),
            "metadata": {k: _short(v) for k, v in meta.items()},
            "n_tensors": len(tensors),
            "n_params": sum(t.n_elements for t in tensors),
            "tensor_bytes": sum(t.nbytes for t in tensors),
            "tensors": tensors,
        }


def _print_text(d: dict[str, Any], show_tensors: bool) -> None:
    print(f"file:          {d['path']} ({_human(d['file_size'])}, GGUF v{d['gguf_version']})")
    print(f"architecture:  {d['architecture']}")
    print(f"parameters:    {d['n_params']:,} in {d['n_tensors']} tensors ({_human(d['tensor_bytes'])})")
    print("metadata:")
    width = max((len(k) for k in d["metadata"]), default=0)
    for k, v in d["metadata"].items():
        print(f"  {k:<{width}}  {v}")
    if show_tensors:
        t_list: list[TensorInfo] = d["tensors"]
        nw = max((len(t.name) for t in t_list), default=4)
        print("tensors:")
        print(f"  {'name':<{nw}}  {'type':<6}  {'shape':<20}  size")
        for t in t_list:
            shape = "[" + ", ".join(map(str, t.shape)) + "]"
            print(f"  {t.name:<{nw}}  {t.type:<6}  {shape:<20}  {_human(t.nbytes)}")


def _print_system(rpc: str | None) -> None:
    from ..rpc import add_rpc_servers
    from ..system import devices, system_info

    add_rpc_servers(rpc)
    print(f"system:        {system_info()}")
    for d in devices():
        print(f"device {d.index}:      {d.name} ({d.type}, {d.description}, {d.memory_total / 2**30:.1f} GiB)")


def run(args: argparse.Namespace) -> int:
    if args.system or not args.files or args.rpc:
        _print_system(args.rpc)
        if not args.files:
            return 0
        print()
    for i, path in enumerate(args.files):
        d = describe(path)
        if args.json:
            d = dict(d, tensors=[] if args.no_tensors else [vars(t) for t in d["tensors"]])
            print(json.dumps(d, default=str))
        else:
            if i:
                print()
            _print_text(d, not args.no_tensors)
    return 0
