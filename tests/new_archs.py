"""The Gemma-3, Gemma-4 and Qwen3-MoE test targets: tiny transformers checkpoints (tests/hf_checkpoints.py)
converted to f32 GGUFs by our converter, built once per test session and shared by the test files."""
from __future__ import annotations

from pathlib import Path

import hf_checkpoints as hf
from dspark_ggml.convert import convert

BUILDERS = {
    "gemma3": lambda d: hf.make_gemma3_target(d),
    "gemma4-dense": lambda d: hf.make_gemma4_target(d, "dense", dtype="float32"),
    "gemma4-ple": lambda d: hf.make_gemma4_target(d, "ple", dtype="float32"),
    "gemma4-moe": lambda d: hf.make_gemma4_target(d, "moe", dtype="float32"),
    "gemma4-conditional": lambda d: hf.make_gemma4_conditional_target(d, dtype="float32"),
    "qwen3moe": lambda d: hf.make_qwen3moe_target(d, dtype="float32"),
}
CASES = sorted(BUILDERS)
GEMMA = [c for c in CASES if c.startswith("gemma4")]
SLIDING = [c for c in CASES if c.startswith("gemma")]  # Gemma-3 and -4: sliding-window layers
WINDOW = 8  # the Gemma fixtures' sliding window


def converted(root: Path, case: str) -> tuple[Path, Path]:
    """(HF checkpoint directory, f32 GGUF) of `case` under root, made on first use."""
    hf_dir, out = root / case, root / f"{case}.gguf"
    if not out.exists():
        BUILDERS[case](hf_dir)
        tmp = out.with_suffix(".part.gguf")
        convert(hf_dir, tmp, outtype="f32", progress=False)
        tmp.rename(out)
    return hf_dir, out
