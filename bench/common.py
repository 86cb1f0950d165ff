"""Shared pieces of the benchmarks: cached random models, timing, and table printing."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

RESULTS = Path(os.environ.get("DSPARK_BENCH_DIR", Path(__file__).resolve().parent / "results"))


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


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A Markdown table, so it can be pasted into notes as it is."""
    cells = [[str(h) for h in headers]] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(line(r))
