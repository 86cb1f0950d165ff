"""Catching silent mis-conversions of drafts: measure the acceptance of the draft as converted and
of the likely alternatives (the other block layout, target layer ids shifted by one).

The usual failure of a DFlash/DSpark port is not an error but an accepted length near 1: a wrong
anchor layout, a layer index off by one (the conventions differ by one), or a reduced lm head
swapped for the target's. Greedy decoding with each variant on a few prompts tells them apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from .draft import DraftModel
from .engine import build_engine
from .model import Model
from .sampling import SamplingParams

CHECK_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "The three primary colors are",
    "Question: A shop sells pens at 3 dollars each. How much do 7 pens cost?\nAnswer:",
)

# an alternative must beat the configuration by this much to be reported as the likely truth
CLEARLY_BETTER = 1.25


@dataclass
class CheckRow:
    variant: str
    sample_from_anchor: bool
    layer_offset: int
    tau: float
    acceptance: float
    hint: str  # how to convert for this variant


def _variants(info, n_target_layers: int) -> list[tuple[str, bool, int, str]]:
    out = [("as converted", info.sample_from_anchor, 0, "")]
    other = not info.sample_from_anchor
    out.append((f"{'anchor-first' if other else '1+N'} layout", other, 0,
                f"reconvert with --sample-from-anchor {'true' if other else 'false'}"))
    if min(info.target_layers) - 1 >= 0:
        out.append(("layer ids -1", info.sample_from_anchor, -1,
                    "the layer ids are one too high: reconvert with the other --target-layer-convention"))
    if max(info.target_layers) + 1 <= n_target_layers:
        out.append(("layer ids +1", info.sample_from_anchor, +1,
                    "the layer ids are one too low: reconvert with the other --target-layer-convention"))
    return out


def _prompts_as_tokens(target_path: str, prompts: Sequence[str], n_vocab: int) -> list[list[int]]:
    try:
        from .tokenizer import Tokenizer

        tok = Tokenizer.from_gguf(target_path)
        return [tok.encode(p, add_special=False) for p in prompts]
    except Exception:  # a GGUF without a tokenizer: fixed token ids still tell the variants apart
        return [[(7 * i + 3 * j + 1) % n_vocab for j in range(12)] for i in range(len(prompts))]


def check_draft(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str], *,
                prompts: Sequence[str] = CHECK_PROMPTS, max_tokens: int = 48, n_threads: int | None = None,
                n_ctx: int = 1024) -> list[CheckRow]:
    """Greedy speculative decoding on a few prompts with the draft as converted and with each
    alternative; returns one row per variant (the first is the configuration in the file)."""
    target = Model(target_path)
    base = DraftModel(draft_path, target)
    tokens = _prompts_as_tokens(os.fspath(target_path), prompts, target.n_vocab)
    rows = []
    for name, anchor_first, offset, hint in _variants(base.info, target.n_layer):
        draft = DraftModel(draft_path, target, sample_from_anchor=anchor_first, layer_offset=offset)
        engine = build_engine(target, draft, n_ctx=n_ctx, context_options={"n_threads": n_threads})
        for p in tokens:
            engine.generate(p, SamplingParams(max_tokens=max_tokens))
            engine.remove(0)
        st = engine.stats()
        rows.append(CheckRow(name, anchor_first, offset, st.mean_accepted_length, st.acceptance_rate, hint))
    return rows


def verdict(rows: Sequence[CheckRow]) -> str | None:
    """A warning when an alternative is clearly better than the configuration, else None."""
    best = max(rows[1:], key=lambda r: r.tau, default=None)
    if best and best.tau > CLEARLY_BETTER * rows[0].tau and best.tau - rows[0].tau > 0.3:
        return (f"the draft does much better with '{best.variant}' (tau {best.tau:.2f} vs {rows[0].tau:.2f} as "
                f"converted): {best.hint}")
    return None
