"""Driving an Engine to the end in tests, the way a host loop around Engine.step() would."""
from __future__ import annotations

from typing import Any


def step_to_end(eng: Any, outs: Any) -> Any:
    """Step ``eng`` until none of the sequences of ``outs`` is active, adding each step's new tokens
    to them; ``outs``: sequence id -> tokens so far (a dict, or a list indexed by id). Returns it."""
    ids = list(outs) if isinstance(outs, dict) else list(range(len(outs)))
    while any(eng.status(s) == "active" for s in ids):
        eng.step()
        for s in ids:
            outs[s] += eng.new_tokens(s)[0]
    return outs
