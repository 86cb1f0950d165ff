"""Our CPU attention node (csrc/src/dspark-attention.cpp), which replaces ggml's flash attention
where the KV cache is in host memory: against the numpy reference over several 64-cell blocks with
grouped query heads, against ggml's own kernel, and bit-identical for a sequence alone and in a
batch whose cells interleave with its own."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from dspark_ggml.context import Context
from dspark_ggml.model import Model
from dspark_ggml import system
from tests.reference.numpy_target import TargetRef

RNG = np.random.default_rng(11)
LONG = RNG.integers(0, 256, 150).astype(np.int32)  # 150 cells: two full blocks and a partial one


def _has_kernel() -> bool:
    feats = system.system_info()
    return "AVX2" in feats and "F16C" in feats and "FMA" in feats


# (query heads, KV heads, head size): the node scores up to 4 rows of a group at once and keeps up
# to 8 vectors of each output in registers, so groups of 2, 3 (SmolLM2) and 6 (two calls) and head
# sizes of 32 to 256 (several passes over the output) take each of its paths.
GROUPS = [(4, 2, 32), (9, 3, 64), (12, 2, 128), (8, 1, 256)]


@pytest.fixture(scope="module")
def gqa(make_target):
    # 4 query heads on 2 KV heads, head size 32: every block is read by two heads per KV head
    return make_target("attn_gqa", arch="qwen3", n_head=4, n_head_kv=2, head_dim=32, n_layer=2)


@pytest.fixture(scope="module", params=GROUPS, ids=lambda g: f"h{g[0]}_kv{g[1]}_d{g[2]}")
def grouped(make_target, request):
    n_head, n_head_kv, head_dim = request.param
    return make_target(f"attn_g{n_head}_{n_head_kv}_{head_dim}", arch="qwen3", n_head=n_head, n_head_kv=n_head_kv,
                       head_dim=head_dim, n_layer=2)


def test_long_prompt_matches_numpy(grouped):
    path, w, cfg = grouped
    m = Model(path)
    ctx = Context(m, n_ctx=256, type_kv="f32", flash_attn=True, n_threads=2)
    ctx.decode(LONG, outputs=np.ones(len(LONG), bool))
    ref, _ = TargetRef(w, cfg).forward(LONG, np.arange(len(LONG)))
    assert np.abs(ctx.get_logits() - ref).max() <= 1e-3


def test_a_sequence_is_bit_identical_alone_and_in_a_batch(gqa):
    """Two sequences decoded together, so that their cells share blocks: each one's logits are the
    ones it gets alone, bit for bit (f16 cache, as generation uses)."""
    path, _, _ = gqa
    m = Model(path)
    other = RNG.integers(0, 256, 90).astype(np.int32)
    alone = Context(m, n_ctx=512, n_seq_max=2, flash_attn=True, n_threads=2)
    alone.decode(LONG)
    alone.decode(LONG[:9], positions=np.arange(150, 159), outputs=np.ones(9, bool))
    want = alone.get_logits(copy=True)

    both = Context(m, n_ctx=512, n_seq_max=2, flash_attn=True, n_threads=2, n_batch=512)
    toks = np.concatenate([LONG, other])
    pos = np.concatenate([np.arange(150), np.arange(90)])
    seqs = np.concatenate([np.zeros(150, np.int32), np.ones(90, np.int32)])
    both.decode(toks, positions=pos, seq_ids=seqs, outputs=np.zeros(240, bool) | (np.arange(240) == 239))
    toks2 = np.concatenate([LONG[:9], other[:5]])
    pos2 = np.concatenate([np.arange(150, 159), np.arange(90, 95)])
    seqs2 = np.concatenate([np.zeros(9, np.int32), np.ones(5, np.int32)])
    both.decode(toks2, positions=pos2, seq_ids=seqs2, outputs=np.arange(14) < 9)
    assert np.array_equal(both.get_logits(), want)


_SCRIPT = """
import sys, numpy as np
from dspark_ggml.model import Model
from dspark_ggml.context import Context
m = Model(sys.argv[1])
c = Context(m, n_ctx=256, flash_attn=True, n_threads=2)
toks = np.array(sys.argv[2].split(','), dtype=np.int32)
c.decode(toks, outputs=np.ones(len(toks), bool))
prefill = c.get_logits(copy=True)
c.kv_seq_rm(0, len(toks) - 9)
steps = []
for i in range(len(toks) - 9, len(toks)):
    c.decode(toks[i:i + 1], positions=[i])
    steps.append(c.get_logits(copy=True)[0])
np.save(sys.argv[3], np.stack([prefill[-9:], np.array(steps)]))
"""


@pytest.mark.skipif(not _has_kernel(), reason="this CPU build has no AVX2/F16C kernel: ggml's is used")
def test_it_computes_ggml_prefill_bits_for_every_batch(grouped, tmp_path):
    """ggml's flash attention takes batches of 64 queries and more through a tiled kernel and
    smaller ones through a one-query kernel (q rounded to f16), so its decode steps differ from its
    prefill. Ours repeats the tiled kernel's arithmetic for every query: a 150-token prefill gives
    ggml's logits bit for bit (so perplexity and KL divergence are llama.cpp's), and the decode
    steps over the same cells give the prefill's rows."""
    path, _, _ = grouped
    out = {}
    for name, env in (("ours", {}), ("ggml", {"DSPARK_CPU_ATTENTION": "ggml"})):
        dst = tmp_path / f"{name}.npy"
        subprocess.run([sys.executable, "-c", _SCRIPT, str(path), ",".join(map(str, LONG)), str(dst)], check=True,
                       env={**os.environ, **env}, timeout=120)
        out[name] = np.load(dst)  # [prefill rows, decode-step rows] of the last 9 tokens
    assert np.array_equal(out["ours"][0], out["ggml"][0])
    assert np.array_equal(out["ours"][1], out["ours"][0])
    assert not np.array_equal(out["ggml"][1], out["ggml"][0])  # ggml's one-query kernel rounds otherwise
    assert np.abs(out["ggml"][1] - out["ggml"][0]).max() <= 2e-2
