"""Build llama.cpp's own programs from the pinned sdist tree, for side-by-side benchmarks.

    python bench/llama_cpp_build.py [--targets llama-bench llama-completion ...] [--jobs 2]

The tree is the same `llama-cpp-python==0.3.36` sdist our ggml comes from (third_party/
llama_cpp_sdist.py: cached, sha256-checked), configured like our default build (GGML_NATIVE=ON,
llamafile on, no CURL), built into <cache>/llama.cpp-build. On x86 the AMX instructions are left out
(-mno-amx-*): a native build on a CPU that reports AMX puts quantized weights in ggml's AMX buffer,
which our runtime never uses, and on virtual machines whose hypervisor does not pass AMX through
every quantized run then dies (SIGILL/SIGSEGV) unless --no-repack also turns off the repacking
that our runtime does use. Prints the bin directory; a second run
only rebuilds what changed. The benchmarks call `bin_dir()` to find the programs.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TARGETS = ["llama-bench", "llama-completion", "llama-speculative-simple", "llama-server", "llama-quantize",
                   "llama-perplexity"]


def _sdist():
    spec = importlib.util.spec_from_file_location("llama_cpp_sdist", REPO / "third_party" / "llama_cpp_sdist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_dir() -> Path:
    return _sdist().cache_dir() / "llama.cpp-build"


def bin_dir() -> Path:
    return build_dir() / "bin"


def program(name: str) -> Path | None:
    """Path of a built llama.cpp program, or None if it has not been built."""
    p = bin_dir() / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def build(targets: list[str], jobs: int) -> Path:
    sdist = _sdist()
    src = sdist.cache_dir() / "llama.cpp-src"
    tree = sdist.extract("", src)  # the whole vendor/llama.cpp tree
    out = build_dir()
    if not (out / "CMakeCache.txt").exists():
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() in ("x86_64", "AMD64") else ""
        subprocess.run(["cmake", "-S", str(tree), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DGGML_NATIVE=ON", "-DGGML_LLAMAFILE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                        "-DLLAMA_BUILD_TESTS=OFF", f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={out / 'bin'}",
                        f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"],
                       check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(jobs), "--target", *targets], check=True)
    return out / "bin"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    print(build(args.targets, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
