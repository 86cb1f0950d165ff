"""Target-only vs speculative decoding on the same prompts, measured side by side in one run
(machines are noisy: the ratios are what to read). Used by `dspark-ggml bench` and the scripts in bench/."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .draft import DraftModel
from .engine import Engine, SpecStats, build_engine
from .model import Model
from .sampling import SamplingParams


@dataclass
class BenchRow:
    temperature: float
    draft_mode: str
    target_tok_s: float
    spec_tok_s: float
    stats: SpecStats
    t_target_step_ms: float  # one target-only decode step

    @property
    def speedup(self) -> float:
        return self.spec_tok_s / self.target_tok_s

    @property
    def draft_ms(self) -> float:
        """One speculative step's draft pass."""
        return self.stats.t_draft_ms / max(self.stats.n_steps, 1)

    @property
    def verify_ms(self) -> float:
        """One speculative step's verify pass."""
        return self.stats.t_verify_ms / max(self.stats.n_steps, 1)

    @property
    def host_ms(self) -> float:
        """One speculative step's host work (sampling, acceptance, bookkeeping)."""
        return self.stats.t_host_ms / max(self.stats.n_steps, 1)

    @property
    def ideal_speedup(self) -> float:
        """What tau and the measured pass costs allow: tau * t_target_step / (t_draft + t_verify)."""
        per_step = self.draft_ms + self.verify_ms
        return self.stats.mean_accepted_length * self.t_target_step_ms / per_step if per_step else 0.0

    @property
    def measured_over_ideal(self) -> float:
        """speedup / ideal_speedup: what the engine costs beyond the two passes (1: nothing)."""
        return self.speedup / self.ideal_speedup if self.ideal_speedup else 0.0


def load_prompts(path: str | os.PathLike[str], n: int) -> list[str]:
    """The first turn of the first n lines of a JSONL prompt file ({"turns": [...]} per line)."""
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line)["turns"][0])
            if len(out) == n:
                break
    return out


def _run(engine: Engine, prompts: Sequence[Sequence[int]], sp: SamplingParams, desc: str,
         progress: bool) -> float:
    """Decoding tokens/s over the prompts: tokens after each prompt's first (which its prefill
    emits) per second of decoding (prefill excluded), as llama.cpp reports its eval speed."""
    from tqdm import tqdm

    n, t0, prefill0 = 0, time.perf_counter(), engine.stats().t_prefill_ms
    for i, p in enumerate(tqdm(prompts, desc=desc, disable=not progress, leave=False)):
        sp.seed = i
        n += len(engine.generate(p, sp)) - 1
        engine.remove(0)
    seconds = time.perf_counter() - t0 - (engine.stats().t_prefill_ms - prefill0) / 1e3
    return n / seconds


def compare(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str], prompts: Sequence[Sequence[int]], *,
            temperatures: Sequence[float] = (0.0,), draft_modes: Sequence[str] = ("greedy",), max_tokens: int = 128,
            n_threads: int | None = None, n_max: int = 0, eog: Sequence[int] = (), progress: bool = False,
            markov_top_k: int = 0, backend_sampling: Sequence[bool] = (False,)) -> list[BenchRow]:
    """Run every prompt target-only and speculatively, for each temperature, drafting mode and
    place of sampling (``backend_sampling``: host, in-graph, or both side by side)."""
    target = Model(target_path)
    draft = DraftModel(draft_path, target)
    n_ctx = max(len(p) for p in prompts) + max_tokens + 32

    def engine(with_draft: bool, mode: str = "greedy", in_graph: bool = False) -> Engine:
        return build_engine(target, draft if with_draft else None, n_ctx=n_ctx, context_options={"n_threads": n_threads},
                            n_max=n_max, draft_mode=mode, eog=eog, markov_top_k=markov_top_k,
                            backend_sampling=in_graph)

    rows = []
    for temp in temperatures:
        base = engine(False)
        tok_s0 = _run(base, prompts, SamplingParams(temperature=temp, max_tokens=max_tokens), f"T={temp} target only", progress)
        sb = base.stats()
        for mode in draft_modes:
            if temp == 0.0 and mode != draft_modes[0]:
                continue  # at temperature 0 every mode drafts the argmax chain
            for in_graph in backend_sampling:
                eng = engine(True, mode, in_graph)
                label = mode + (" +backend" if in_graph else "")
                tok_s1 = _run(eng, prompts, SamplingParams(temperature=temp, max_tokens=max_tokens), f"T={temp} {label}",
                              progress)
                rows.append(BenchRow(temp, label, tok_s0, tok_s1, eng.stats(), sb.t_verify_ms / max(sb.n_steps, 1)))
    return rows


def default_prompt_file() -> Path | None:
    """The shared HumanEval prompts when running from a checkout next to them."""
    p = Path(__file__).resolve().parents[3] / "shared" / "data" / "prompts" / "humaneval.jsonl"
    return p if p.exists() else None
