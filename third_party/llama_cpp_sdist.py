#!/usr/bin/env python3
"""Obtain the pinned ggml source tree (and llama.cpp reference files) without git.

The tree comes from the `llama-cpp-python==0.3.36` source distribution on PyPI, whose
`vendor/llama.cpp/ggml` is ggml 0.25.3. The archive is downloaded once with pip, checked
against a pinned sha256 and cached; members are extracted from the cached archive on demand.

Usage (CMake calls the first form at configure time):
    python llama_cpp_sdist.py extract ggml --dest DIR      # prints the extracted ggml path
    python llama_cpp_sdist.py extract PREFIX --dest DIR    # any vendor/llama.cpp/PREFIX subtree
    python llama_cpp_sdist.py archive                      # prints the cached archive path

Cache directory: $DSPARK_GGML_CACHE, else $XDG_CACHE_HOME/dspark-ggml, else ~/.cache/dspark-ggml.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
ARCHIVE = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TREE = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"


def cache_dir() -> Path:
    if os.environ.get("DSPARK_GGML_CACHE"):
        return Path(os.environ["DSPARK_GGML_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dspark-ggml"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(dest_dir: Path) -> None:
    # --no-build-isolation: without it pip builds the sdist's build requirements from source
    # (cmake among them) just to read its metadata, which takes many minutes.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", "--disable-pip-version-check", "-q",
           f"{PACKAGE}=={VERSION}", "-d", str(dest_dir)]
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def ensure_archive() -> Path:
    """Return the path of the verified cached archive, downloading it if needed."""
    cache = cache_dir()
    path = cache / ARCHIVE
    if path.exists() and sha256_of(path) == SHA256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        download(Path(tmp))
        got = Path(tmp) / ARCHIVE
        digest = sha256_of(got)
        if digest != SHA256:
            raise SystemExit(f"{ARCHIVE}: sha256 {digest} does not match the pinned {SHA256}")
        os.replace(got, path)
    return path


def extract(prefix: str, dest: Path) -> Path:
    """Extract vendor/llama.cpp/<prefix> into dest (once) and return the extracted path."""
    out = dest / prefix
    stamp = dest / f".{prefix.replace('/', '_')}.{SHA256[:16]}"
    if stamp.exists() and out.exists():
        return out
    archive = ensure_archive()
    dest.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    want = TREE + prefix
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            if m.name != want and not m.name.startswith(want.rstrip("/") + "/"):
                continue
            if not (m.isfile() or m.isdir()):
                continue  # no links or devices from an archive
            m.name = m.name[len(TREE):]
            members.append(m)
        if not members:
            raise SystemExit(f"{archive}: no member under {want}")
        tar.extractall(dest, members=members, filter="data")
    stamp.touch()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract")
    ex.add_argument("prefix", help="path under vendor/llama.cpp, e.g. ggml")
    ex.add_argument("--dest", type=Path, default=None, help="default: <cache>/tree")
    sub.add_parser("archive")
    args = ap.parse_args(argv)
    if args.cmd == "archive":
        print(ensure_archive())
    else:
        print(extract(args.prefix, args.dest or cache_dir() / "tree"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
