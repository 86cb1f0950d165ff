"""Same GGUF, same greedy tokens: our runtime against llama.cpp (its llama-server, which takes and
returns token ids).

    python bench/greedy_vs_llamacpp.py [--n 48] [--llama-server PATH] [GGUF ...]

Without GGUF arguments it converts the tiny Gemma-4 (dense, per-layer embeddings, MoE; with a KV
sharing layout llama.cpp can run, see LLAMA_CPP_SHARING) and Qwen3-MoE test checkpoints
(tests/hf_checkpoints.py, f32) into bench/results and checks those, plus the MoE benchmark models of
bench/bench_target.py (--models gemma4-moe qwen3moe) when they exist. For each file, a prompt is tokenized by
our tokenizer and continued greedily for --n tokens by both programs (end-of-generation tokens
ignored); the token ids must be equal. Prints a table; exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from common import RESULTS, print_table
from bench_server import Server
from tests.server_process import free_port
import llama_cpp_build

PROMPT = "def fibonacci(n):\n    return"


# llama.cpp maps the KV-sharing layers onto the last two layers before them (sliding, then global);
# transformers (and we) onto the last earlier layer of the same kind. The two agree when those last
# two layers are [sliding, global]: 3 shared layers in the test layout [s, s, f, s, s, f].
LLAMA_CPP_SHARING = {"num_kv_shared_layers": 3}


def tiny_models() -> list[Path]:
    from dspark_ggml.convert import convert
    from tests import hf_checkpoints as hf

    root = RESULTS / "tiny"
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for variant in ("dense", "ple", "moe"):
        path = root / f"gemma4-{variant}-llama-cpp-sharing.gguf"
        if not path.exists():
            d = hf.make_gemma4_target(root / f"gemma4-{variant}", variant, dtype="float32", **LLAMA_CPP_SHARING)
            convert(d, path, outtype="f32", progress=False)
        out.append(path)
    path = root / "qwen3moe.gguf"
    if not path.exists():
        convert(hf.make_qwen3moe_target(root / "qwen3moe", dtype="float32"), path, outtype="f32", progress=False)
    return out + [path] + sorted(RESULTS.glob("*moe-random-q8_0.gguf"))


def prompt_ids(path: Path) -> list[int]:
    from dspark_ggml.tokenizer import Tokenizer

    return Tokenizer.from_gguf(path).encode(PROMPT, add_special=True, parse_special=False)


def ours(path: Path, prompt: list[int], n: int) -> list[int]:
    from dspark_ggml.context import Context
    from dspark_ggml.engine import Engine
    from dspark_ggml.model import Model
    from dspark_ggml.sampling import SamplingParams

    engine = Engine(Context(Model(path), n_ctx=len(prompt) + n + 8, n_threads=2))  # no end-of-generation ids
    return engine.generate(prompt, SamplingParams(max_tokens=n))


def llama_cpp(exe: str, path: Path, prompt: list[int], n: int) -> list[int]:
    """llama-server's token ids for the same prompt ids, greedy (top-k 1), end of generation ignored."""
    port = free_port()
    server = Server("llama-server", [exe, "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                                     "-c", "512", "-np", "1", "--no-warmup"], port, timeout=120)
    try:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False}
        r = httpx.post(f"{server.url}/completion", json=body, timeout=300)
        if r.status_code != 200:
            raise RuntimeError(f"llama-server failed on {path.name}: {r.text[-500:]}\n{server.tail(40)}")
        return [int(t) for t in r.json()["tokens"]]
    finally:
        server.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="*", type=Path)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--llama-server", help="default: the one bench/llama_cpp_build.py built")
    args = ap.parse_args()
    exe = args.llama_server or llama_cpp_build.program("llama-server")
    if not exe:
        print("llama-server not found: build it with `python bench/llama_cpp_build.py`", file=sys.stderr)
        return 2
    rows, ok = [], True
    for path in args.gguf or tiny_models():
        prompt = prompt_ids(path)
        a, b = ours(path, prompt, args.n), llama_cpp(str(exe), path, prompt, args.n)
        same = a == b
        ok = ok and same
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        rows.append([path.name, args.n, "identical" if same else f"DIFFERENT from token {first}: {a[first:first + 4]} vs "
                                                                  f"{b[first:first + 4]}"])
    print_table(["model", "tokens", "greedy token ids vs llama.cpp"], rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
