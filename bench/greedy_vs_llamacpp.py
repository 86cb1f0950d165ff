"""Same GGUF, same greedy text: our runtime against llama.cpp's llama-completion.

    python bench/greedy_vs_llamacpp.py [--n 48] [--llama-completion PATH] [GGUF ...]

Without GGUF arguments it converts the tiny Gemma-4 (dense, per-layer embeddings, MoE) and Qwen3-MoE
test checkpoints (tests/hf_checkpoints.py, f32) into bench/results and checks those, plus the
MoE benchmark models of bench/bench_moe.py when they exist. For each file, a prompt is tokenized by
our tokenizer and continued greedily for --n tokens by both programs (end-of-generation tokens
ignored); the decoded texts must be equal. Prints a table; exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
from common import RESULTS, print_table  # noqa: E402
import llama_cpp_build  # noqa: E402

PROMPT = "def fibonacci(n):\n    return"


def tiny_models() -> list[Path]:
    from new_archs import BUILDERS, converted

    root = RESULTS / "tiny"
    root.mkdir(parents=True, exist_ok=True)
    out = [converted(root, case)[1] for case in ("gemma4-dense", "gemma4-ple", "gemma4-moe", "qwen3moe")]
    assert set(BUILDERS) >= {"gemma4-dense", "qwen3moe"}
    return out + sorted(RESULTS.glob("*moe-random-q8_0.gguf"))


def ours(path: Path, n: int) -> str:
    from dspark_ggml.context import Context
    from dspark_ggml.engine import Engine
    from dspark_ggml.model import Model
    from dspark_ggml.sampling import SamplingParams
    from dspark_ggml.tokenizer import Tokenizer

    model = Model(path)
    tok = Tokenizer.from_gguf(path)
    prompt = tok.encode(PROMPT, add_special=True, parse_special=False)
    engine = Engine(Context(model, n_ctx=len(prompt) + n + 8, n_threads=2))  # no end-of-generation ids
    return tok.decode(engine.generate(prompt, SamplingParams(max_tokens=n)))


def llama_cpp(exe: str, path: Path, n: int) -> str:
    cmd = [exe, "-m", str(path), "-p", PROMPT, "-n", str(n), "--temp", "0", "--ignore-eos", "-no-cnv",
           "--no-display-prompt", "-t", "2", "-c", "512", "--no-warmup"]
    proc = subprocess.run(cmd, capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-completion failed on {path.name}: {proc.stderr.decode(errors='replace')[-2000:]}")
    return proc.stdout.decode("utf-8", errors="replace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="*", type=Path)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--llama-completion", help="default: the one bench/llama_cpp_build.py built")
    args = ap.parse_args()
    exe = args.llama_completion or llama_cpp_build.program("llama-completion")
    if not exe:
        print("llama-completion not found: build it with `python bench/llama_cpp_build.py`", file=sys.stderr)
        return 2
    rows, ok = [], True
    for path in args.gguf or tiny_models():
        a, b = ours(path, args.n), llama_cpp(str(exe), path, args.n)
        same = a == b
        ok = ok and same
        rows.append([path.name, args.n, "identical" if same else f"DIFFERENT: {a[:40]!r} vs {b[:40]!r}"])
    print_table(["model", "tokens", "greedy text vs llama.cpp"], rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
