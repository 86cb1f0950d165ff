"""Speculative decoding on the Gemma-4 and Qwen3-MoE targets.

Each target gets a planted DSpark draft: its Markov head holds the target's own greedy bigrams
(prev -> next) over a zero lm head, so its chains are accepted when the target's greedy path is a
function of the previous token. Greedy output must be identical with and without the draft, in
both block layouts, across the sliding-window edge (48 tokens, window 8), and the planted draft
must reach the acceptance it is built for. Converted Gemma-4 DSpark checkpoints (DeepSpec and
speculators formats) run against their target losslessly too.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the targets are made with transformers (`reference` extra)")
pytest.importorskip("transformers")

from new_archs import CASES, converted  # noqa: E402

from dspark_ggml.context import Context  # noqa: E402
from dspark_ggml.draft import DraftContext, DraftModel  # noqa: E402
from dspark_ggml.engine import Engine  # noqa: E402
from dspark_ggml.errors import DSparkError  # noqa: E402
from dspark_ggml.model import Model  # noqa: E402
from dspark_ggml.sampling import SamplingParams  # noqa: E402
from tests.tiny_models import DraftConfig, TargetConfig, write_draft  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402

N_NEW = 48
SPEC_CASES = [c for c in CASES if c != "gemma4-conditional"]  # its text model is gemma4-dense's
BLOCK = 6


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.getbasetemp() / "new_archs"
    r.mkdir(exist_ok=True)
    return r


def _engine(target: Model, draft: DraftModel | None = None, n_seq: int = 1) -> Engine:
    ctx = Context(target, n_ctx=256, n_seq_max=n_seq, n_batch=64, type_kv="f32", n_threads=1)
    dctx = DraftContext(draft, n_ctx=256, n_seq_max=n_seq, type_kv="f32", n_threads=1) if draft else None
    return Engine(ctx, dctx)


def _greedy(target: Model, prompt: list[int], n: int = N_NEW) -> list[int]:
    return _engine(target).generate(prompt, SamplingParams(max_tokens=n))


def _table(path: list[int]) -> dict[int, int]:
    """The planted bigrams: the first successor seen of each token on the target's path."""
    table: dict[int, int] = {}
    for a, b in zip(path, path[1:]):
        table.setdefault(a, b)
    return table


def _bigram_acceptance(prompt: list[int], path: list[int], n_draft: int) -> float:
    """The acceptance rate a perfect engine gets from the planted table (simulated here): each step
    drafts min(n_draft, tokens left - 1) tokens along the table from the last token, keeps the
    prefix the target agrees with, and adds the target's own token."""
    table = _table(prompt[-1:] + path)
    done, drafted, accepted = 1, 0, 0  # the prefill emits the first token
    while done < len(path):
        n = min(n_draft, len(path) - done - 1)
        chain, last = [], path[done - 1]
        for _ in range(n):
            last = table.get(last, -1)
            chain.append(last)
        k = 0
        while k < n and chain[k] == path[done + k]:
            k += 1
        drafted, accepted, done = drafted + n, accepted + k, done + k + 1
    return accepted / drafted if drafted else 0.0


def _prompt_and_path(target: Model) -> tuple[list[int], list[int]]:
    """Of a few seeded prompts, the one whose greedy path the bigram table follows best."""
    best = None
    for seed in range(12):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(3, target.n_vocab - 1, size=5)]
        path = _greedy(target, prompt)
        score = _bigram_acceptance(prompt, path, BLOCK - 1)
        if best is None or score > best[0]:
            best = (score, prompt, path)
    return best[1], best[2]


def _planted_draft(root, case: str, target: Model, path: list[int]) -> DraftModel:
    V, E, L = target.n_vocab, target.n_embd, target.n_layer
    shape = TargetConfig(n_vocab=V, n_embd=E, n_layer=L, with_tokenizer=False)
    src = root / f"{case}.planted_src.gguf"
    write_draft(src, DraftConfig(block_size=BLOCK, markov_rank=V, own_head=True, target_layers=[1, L - 1]), shape,
                seed=3, return_weights=False)
    w2 = np.zeros((V, V), np.float32)  # numpy [V, R]: bias[next] = w2[next, prev]
    for a, b in _table(path).items():
        w2[b, a] = 30.0
    dst = rewrite_gguf(src, root / f"{case}.planted.gguf", tensors={
        "markov_w1.weight": np.eye(V, dtype=np.float32), "markov_w2.weight": w2,
        "output.weight": np.zeros((V, E), np.float32)})
    return dst


@pytest.mark.parametrize("layout", ["anchor-first", "1+N"])
@pytest.mark.parametrize("case", SPEC_CASES)
def test_planted_draft_is_lossless_and_accepted(root, case, layout):
    _, path = converted(root, case)
    target = Model(path)
    prompt, expected = _prompt_and_path(target)
    draft_path = _planted_draft(root, case, target, prompt[-1:] + expected)
    draft = DraftModel(draft_path, target, sample_from_anchor=layout == "anchor-first")
    eng = _engine(target, draft)
    got = eng.generate(prompt, SamplingParams(max_tokens=N_NEW))
    assert got == expected
    possible = _bigram_acceptance(prompt, expected, eng.n_draft)
    assert possible >= 0.7  # the table knows most of the way (else the check below says little)
    # the engine gets exactly what the table allows (1.0 where the path is bigram-consistent)
    assert eng.stats().acceptance_rate == pytest.approx(possible)


@pytest.mark.parametrize("case", ["gemma4-dense", "qwen3moe"])
def test_several_sequences_at_once_stay_lossless(root, case):
    _, path = converted(root, case)
    target = Model(path)
    prompt, expected = _prompt_and_path(target)
    draft = DraftModel(_planted_draft(root, case, target, prompt[-1:] + expected), target)
    prompts = [prompt, prompt[:3], [7, 9, 11, 13]]
    refs = [_greedy(target, p, 32) for p in prompts]
    eng = _engine(target, draft, n_seq=3)
    got = [list(eng.add(i, p, SamplingParams(max_tokens=32))) for i, p in enumerate(prompts)]
    while any(eng.status(i) == "active" for i in range(3)):
        eng.step()
        for i in range(3):
            got[i] += eng.new_tokens(i)[0]
    assert got == refs


def test_mismatched_draft_and_target_are_refused(root, make_target):
    _, gemma = converted(root, "gemma4-dense")
    _, qmoe = converted(root, "qwen3moe")
    g, q = Model(gemma), Model(qmoe)
    prompt, path = _prompt_and_path(g)
    for_gemma = _planted_draft(root, "gemma4-dense", g, prompt[-1:] + path)
    with pytest.raises(DSparkError, match="layer|vocab"):
        DraftModel(for_gemma, q)  # same hidden size; other layer count and vocabulary
    qwen3, _, _ = make_target("spec_gemma4_qwen3", n_embd=48)
    with pytest.raises(DSparkError, match="hidden|embd|vocab"):
        DraftModel(for_gemma, Model(qwen3))


@pytest.mark.parametrize("fmt", ["deepspec", "speculators"])
@pytest.mark.parametrize("case", ["gemma4-dense", "gemma4-moe"])
def test_converted_gemma4_dspark_drafts_run_losslessly(root, case, fmt):
    """Gemma-4-backbone DSpark checkpoints as published: DeepSpec's (anchor-first, full vocabulary,
    the target's embeddings) and speculators' (1+N layout, reduced vocabulary with d2t)."""
    import hf_checkpoints as hf
    from dspark_ggml.convert import convert

    hf_target, path = converted(root, case)
    make = hf.make_gemma4_dspark if fmt == "deepspec" else hf.make_gemma4_speculators_dspark
    draft_dir = make(root / f"{case}.{fmt}", hf_target, dtype="float32")
    out = root / f"{case}.{fmt}.gguf"
    convert(draft_dir, out, outtype="f32", target_model_dir=hf_target, progress=False)
    target = Model(path)
    draft = DraftModel(out, target)
    prompts = [[5, 17, 42, 99, 7], [300, 12, 12, 6]]
    for p in prompts:
        eng = _engine(target, draft)
        assert eng.generate(p, SamplingParams(max_tokens=N_NEW)) == _greedy(target, p)
        assert eng.stats().n_drafted > 0
