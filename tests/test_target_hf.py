"""The target runtime against Hugging Face transformers on the same f32 weights."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the HF cross-check needs the `reference` extra (torch, transformers)")
pytest.importorskip("transformers")

from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from tests.reference.hf_target import hf_model  # noqa: E402
from tests.tiny_models import HF_TARGET_VARIANTS, greedy_decode  # noqa: E402

torch.set_grad_enabled(False)

CASES = HF_TARGET_VARIANTS
PROMPT = [3, 17, 42, 99, 5, 260, 7, 1, 64, 128, 31, 200, 8]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(make_target, case):
    path, w, cfg = make_target(f"hf_{case}", **CASES[case])
    ctx = Context(Model(path), n_ctx=256, type_kv="f32")
    pos = np.arange(len(PROMPT)) + 40
    ctx.decode(PROMPT, pos, outputs=np.ones(len(PROMPT), bool))
    ref = hf_model(w, cfg)(input_ids=torch.tensor([PROMPT]), position_ids=torch.tensor(pos)[None]).logits[0]
    assert np.abs(ctx.get_logits() - ref.numpy()).max() <= 1e-3


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_greedy_generation_matches_transformers(make_target, arch):
    path, w, cfg = make_target(f"hf_{arch}", **CASES[arch])
    ctx = Context(Model(path), n_ctx=256, type_kv="f32")
    hf = hf_model(w, cfg)
    expected = hf.generate(torch.tensor([PROMPT]), max_new_tokens=64, do_sample=False,
                           min_new_tokens=64)[0, len(PROMPT):].tolist()
    assert greedy_decode(ctx, PROMPT, 64) == expected
