"""Random requests never crash: decode / kv_* / inject / propose / engine add, step and remove /
sample_rows with random ids, positions, sequence ids, lengths and sampler values (NaN, inf,
negative, huge), interleaved so the low-level calls also pull the engine's caches from under it.
Each call returns or raises a DSparkError; afterwards a valid generation gives the reference
tokens. A fixed seed: a failure is reproduced by its seed and call number (in the message)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.errors import DSparkError
from dspark_ggml.sampling import SamplingParams, sample_rows
from tests.tiny_models import DraftConfig, write_draft, write_id_target

V, N_SEQ, N_CTX, N_BATCH = 24, 3, 64, 16
PROMPT = [3, 17, 5, 9, 1]
FLOATS = [0.0, 0.5, 1.0, 1.7, -1.0, math.nan, math.inf, -math.inf, 1e30, 1e-30]


class RawSampling(SamplingParams):
    """Sampling values that reach the C API unchecked (Python's own checks skipped)."""

    def validate(self) -> None:
        pass


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_requests")
    tcfg, target = write_id_target(d, V, n_layer=2)
    write_draft(d / "d.gguf", DraftConfig(block_size=4), tcfg, seed=6)
    return target, DraftModel(d / "d.gguf", target)


def _ints(rng, lo, hi, n):
    return [int(x) for x in rng.integers(lo, hi, size=n)]


def _sampling(rng) -> SamplingParams:
    cls = RawSampling if rng.random() < 0.7 else SamplingParams
    return cls(temperature=float(rng.choice(FLOATS)), top_k=int(rng.choice([0, 1, 5, -1, 10**6])),
               top_p=float(rng.choice([1.0, 0.9, 0.0, -0.5, 2.0, math.nan])),
               min_p=float(rng.choice([0.0, 0.1, 1.0, -0.1, 1.5, math.nan])),
               seed=int(rng.integers(0, 2**32 - 1)), max_tokens=int(rng.choice([1, 3, 8])))


def _random_call(rng, ctx: Context, dctx: DraftContext, eng: Engine):
    """One random call; returns a short description for the failure message."""
    k = int(rng.integers(12))
    seq = int(rng.integers(-2, N_SEQ + 2))
    if k == 0:
        n = int(rng.integers(0, N_BATCH + 3))
        args = (_ints(rng, -2, V + 2, n), _ints(rng, -2, N_CTX + 2, n), _ints(rng, -1, N_SEQ + 1, n),
                [bool(b) for b in rng.integers(0, 2, size=n)])
        ctx.decode(*args)
        return f"decode{args}"
    if k == 1:
        p0, p1 = _ints(rng, -3, N_CTX + 3, 2)
        ctx.kv_seq_rm(seq, p0, p1)
        return f"kv_seq_rm({seq}, {p0}, {p1})"
    if k == 2:
        dst, p0, p1 = int(rng.integers(-1, N_SEQ + 1)), *_ints(rng, -3, N_CTX + 3, 2)
        ctx.kv_seq_cp(seq, dst, p0, p1)
        return f"kv_seq_cp({seq}, {dst}, {p0}, {p1})"
    if k == 3:
        ctx.kv_seq_keep(seq)
        return f"kv_seq_keep({seq})"
    if k == 4:
        n = int(rng.integers(0, 6))
        width = int(rng.choice([dctx.draft.n_embd * len(dctx.info.target_layers), 7]))
        feats = rng.normal(size=(n, width)).astype(np.float32)
        dctx.inject(feats, _ints(rng, -2, N_CTX + 2, n), _ints(rng, -1, N_SEQ + 1, n))
        return f"inject({n}x{width})"
    if k == 5:
        n = int(rng.integers(0, N_SEQ + 2))
        kw = dict(n_draft=int(rng.integers(-2, 8)), temperature=float(rng.choice(FLOATS)),
                  markov_top_k=int(rng.integers(-1, 40)), want_logits=bool(rng.integers(2)), seed=int(rng.integers(100)))
        dctx.propose(_ints(rng, -2, V + 2, n), _ints(rng, -2, N_CTX + 2, n), _ints(rng, -1, N_SEQ + 1, n), **kw)
        return f"propose({n}, {kw})"
    if k == 6:
        dctx.kv.seq_rm(seq if 0 <= seq < N_SEQ else 0, *_ints(rng, -3, N_CTX + 3, 2))
        return "draft kv seq_rm"
    if k in (7, 8):
        prompt = _ints(rng, -1 if rng.random() < 0.1 else 0, V, int(rng.integers(0, 12)))
        sp = _sampling(rng)
        eng.add(seq, prompt, sp)
        return f"add({seq}, {prompt}, {sp})"
    if k == 9:
        eng.step()
        return "step()"
    if k == 10:
        eng.remove(seq)
        return f"remove({seq})"
    logits = rng.normal(0, 3, size=(int(rng.integers(1, 4)), int(rng.integers(1, 30)))).astype(np.float32)
    logits.flat[rng.integers(logits.size)] = rng.choice([np.nan, np.inf, -np.inf])
    u = rng.choice([0.0, 0.5, 1.0, np.nan, 2.0], size=logits.shape[0]).astype(np.float32)
    sample_rows(logits, u, _sampling(rng), in_graph=bool(rng.integers(2)))
    return "sample_rows"


def _reference(target, draft) -> list[int]:
    ctx = Context(target, n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH, n_threads=1)
    dctx = DraftContext(draft, n_ctx=N_CTX, n_seq_max=N_SEQ, n_threads=1)
    return Engine(ctx, dctx).generate(PROMPT, SamplingParams(max_tokens=12))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_requests_raise_or_succeed_and_leave_a_usable_engine(pair, seed):
    target, draft = pair
    ref = _reference(target, draft)
    ctx = Context(target, n_ctx=N_CTX, n_seq_max=N_SEQ, n_batch=N_BATCH, n_threads=1)
    dctx = DraftContext(draft, n_ctx=N_CTX, n_seq_max=N_SEQ, n_threads=1)
    eng = Engine(ctx, dctx, draft_mode="probabilistic" if seed % 2 else "greedy", backend_sampling=seed == 3)
    rng = np.random.default_rng(seed)
    outcomes = {"ok": 0, "refused": 0}
    for i in range(1000):
        try:
            what = _random_call(rng, ctx, dctx, eng)
            outcomes["ok"] += 1
        except DSparkError:
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"seed {seed}, call {i}: {type(e).__name__}: {e}")
        if i % 50 == 49:  # the engine still gives the reference after whatever came before
            for s in range(N_SEQ):
                if eng.status(s) != "idle":
                    eng.remove(s)
            ctx.kv_clear()
            dctx.kv.clear()
            assert eng.generate(PROMPT, SamplingParams(max_tokens=12)) == ref, f"seed {seed}, after call {i} ({what})"
    assert outcomes["ok"] > 30 and outcomes["refused"] > 30, outcomes


def test_random_generate_options_raise_or_succeed_and_leave_a_usable_llm(pair):
    """The same one level up: LLM.generate / generate_batch with random prompts and options."""
    from dspark_ggml.llm import LLM

    target, draft = pair
    rng = np.random.default_rng(4)
    with LLM(target.path, draft_model_path=draft.path, n_ctx=N_CTX, n_seq_max=2, n_threads=1) as llm:
        ref = llm.generate(PROMPT, max_tokens=12).tokens
        outcomes = {"ok": 0, "refused": 0}
        for i in range(120):
            prompt = _ints(rng, -1 if rng.random() < 0.1 else 0, V + (1 if rng.random() < 0.1 else 0),
                           int(rng.integers(0, 80)))
            bad = rng.random() < 0.5  # half the calls have one bad value or more
            options = dict(temperature=float(rng.choice(FLOATS if bad else [0.0, 0.7, 1.3])),
                           top_k=int(rng.choice([0, 3, -1] if bad else [0, 3])),
                           top_p=float(rng.choice([1.0, 0.5, 0.0, math.nan] if bad else [1.0, 0.5])),
                           min_p=float(rng.choice([0.0, 0.2, 2.0] if bad else [0.0, 0.2])),
                           max_tokens=int(rng.choice([1, 5, 0, -3, 100] if bad else [1, 5, 100])),
                           stop_token_ids=_ints(rng, -1, V + 1, int(rng.integers(0, 3))), seed=int(rng.integers(0, 1000)))
            try:
                if rng.random() < 0.3:
                    llm.generate_batch([prompt, PROMPT], [SamplingParams(**options), SamplingParams(max_tokens=3)])
                else:
                    llm.generate(prompt, **options)
                outcomes["ok"] += 1
            except DSparkError:
                outcomes["refused"] += 1
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"call {i}: {type(e).__name__}: {e} (prompt {prompt}, {options})")
            assert llm.context.kv_n_used == 0, f"call {i}"
        assert llm.generate(PROMPT, max_tokens=12).tokens == ref
        assert outcomes["ok"] > 10 and outcomes["refused"] > 10, outcomes
