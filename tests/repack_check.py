"""The CPU's weight repacking (llama.cpp's faster layouts for some quantized types) against the plain
layout: the same model run both ways must give the same logits up to the kernels' rounding."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from dspark_ggml.context import Context
from dspark_ggml.model import Model


def assert_repacking_computes_the_same(path: Path, prompt: Sequence[int]) -> None:
    out = []
    for repack in (True, False):
        ctx = Context(Model(path, cpu_repack=repack), n_ctx=64, type_kv="f32", n_threads=1)
        ctx.decode(list(prompt), outputs=np.ones(len(prompt), bool))
        out.append(ctx.get_logits(copy=True))
    assert np.abs(out[0] - out[1]).max() <= 1e-2 * np.abs(out[1]).max()
