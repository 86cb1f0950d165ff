"""`dspark_ggml.perplexity` and `dspark-ggml perplexity`: perplexity and KL divergence as
llama.cpp's llama-perplexity computes them, and its base-file format.

Against independent numpy computations on tiny random models (logits straight from a Context),
and against files and numbers written by the real llama-perplexity (tests/data/perplexity/):

* ``exact_base.bin.gz``: llama-perplexity's base file for an *exact* model: one llama layer whose
  attention and FFN weights are zero, ±1 embeddings, an rms epsilon of 0 and an output matrix of
  multiples of 1/8, so every logit is a short sum of exact binary fractions and any engine computes
  the same float32 bits. Our base file for that model must be the same bytes (the float32
  min_log_prob may differ in its last bit: it goes through exp and log), our PPL llama's printed
  PPL, and our KL divergence of a second exact model (other output weights) from that base llama's
  printed per-chunk numbers.
* ``random_bos_base.bin.gz``: llama-perplexity's base file for a tiny random qwen3 (seed 7) whose
  tokenizer adds a BOS, so each chunk starts with BOS: our model must diverge from it by no more
  than the two engines' float rounding, which a chunk without its BOS would not.
* ``llama.json``: the commands and llama-perplexity's printed numbers; ``text.txt``: the text.

Regenerate all of them (after a change to tests/tiny_models.py's tokenizer or random weights) with
``python tests/test_perplexity.py --regenerate DIR_OF_LLAMA_CPP_BINARIES`` (llama-perplexity
built from the llama.cpp that llama-cpp-python 0.3.36 vendors).
"""
from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dspark_ggml import perplexity as P  # noqa: E402
from dspark_ggml.errors import FileAccessError, FileFormatError, InvalidArgumentError  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402
from tests.tiny_models import TargetConfig, write_target  # noqa: E402

DATA = ROOT / "tests" / "data" / "perplexity"
N_CTX = 32           # the fixtures' context
N_VOCAB = 272        # >= 260 for the byte-level tokenizer; 12 merges
RANDOM_SEED = 7


# ---- models ---------------------------------------------------------------------------------------

def _hash(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Deterministic integer mixing (no random generator: the same values on every numpy)."""
    x = (a.astype(np.int64) * 2654435761 + b.astype(np.int64) * 40503 + k * 97) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 1274126177) & 0xFFFFFFFF
    return x ^ (x >> 16)


def write_exact_model(path: Path, variant: int = 0) -> Path:
    """The exact model (module doc); ``variant`` 1 perturbs the output matrix by ±1/8."""
    src = path.with_suffix(".src.gguf")
    cfg = TargetConfig(arch="llama", n_vocab=N_VOCAB, n_layer=1, rms_eps=0.0)
    weights = write_target(src, cfg, seed=0)
    v, e = np.meshgrid(np.arange(N_VOCAB), np.arange(cfg.n_embd), indexing="ij")
    embd = np.where(_hash(v, e, 1) & 1, 1.0, -1.0).astype(np.float32)
    out = ((_hash(v, e, 2) % 9).astype(np.float32) - 4) / 8
    if variant:
        out = out + ((_hash(v, e, 3 + variant) % 3).astype(np.float32) - 1) / 8
    tensors = {name: np.zeros_like(w) for name, w in weights.items()}
    tensors.update({name: np.ones_like(w) for name, w in weights.items() if name.endswith("norm.weight")})
    tensors["token_embd.weight"] = embd
    tensors["output.weight"] = out.astype(np.float32)
    rewrite_gguf(src, path, tensors=tensors)
    src.unlink()
    return path


def write_random_bos_model(path: Path) -> Path:
    src = path.with_suffix(".src.gguf")
    write_target(src, TargetConfig(n_vocab=N_VOCAB), seed=RANDOM_SEED, return_weights=False)
    rewrite_gguf(src, path, set_keys={"tokenizer.ggml.add_bos_token": True})
    src.unlink()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ppl_models")
    return {"exact": write_exact_model(d / "exact.gguf"), "exact1": write_exact_model(d / "exact1.gguf", 1),
            "random_bos": write_random_bos_model(d / "random_bos.gguf")}


@pytest.fixture(scope="module")
def text() -> str:
    return P.read_text(DATA / "text.txt")


@pytest.fixture(scope="module")
def llama() -> dict:
    return json.loads((DATA / "llama.json").read_text())


def _unzip(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name.removesuffix(".gz")
    out.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    return out


# ---- independent numpy references -----------------------------------------------------------------

def _chunk_logits_numpy(model, tokens: np.ndarray, n_ctx: int, n_chunk: int,
                        bos: int | None) -> list[np.ndarray]:
    """Every position's logits per chunk, each chunk decoded alone in a fresh context."""
    import dspark_ggml as dg

    out = []
    for c in range(n_chunk):
        ctx = dg.Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, type_kv="f32")
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        ctx.decode(chunk, outputs=[True] * n_ctx)
        out.append(ctx.get_logits(copy=True).astype(np.float64))
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _scored(lp: np.ndarray, chunk_tokens: np.ndarray, n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """(log-prob rows of the scored positions, the tokens they predict)."""
    first = n_ctx // 2
    return lp[first:n_ctx - 1], chunk_tokens[first + 1:n_ctx]


# ---- perplexity ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(make_target):
    import dspark_ggml as dg

    path_a, _, _ = make_target("ppl_a", seed=11, n_vocab=300)
    path_b, _, _ = make_target("ppl_b", seed=12, n_vocab=300)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 296, size=3 * 32 + 7).astype(np.int32)
    return dg.Model(str(path_a)), dg.Model(str(path_b)), tokens


def test_perplexity_equals_numpy(tiny):
    model, _, tokens = tiny
    n_ctx, n_chunk = 32, 3
    for bos in (None, 5):
        res = P.perplexity(model, tokens=tokens, n_ctx=n_ctx, bos=bos, n_threads=2, type_kv="f32")
        nll = []
        for c, logits in enumerate(_chunk_logits_numpy(model, tokens, n_ctx, n_chunk, bos)):
            lp, nxt = _scored(_log_softmax(logits), tokens[c * n_ctx:(c + 1) * n_ctx], n_ctx)
            nll.append(-lp[np.arange(len(nxt)), nxt])
        nll = np.concatenate(nll)
        ppl = math.exp(nll.mean())
        err = ppl * math.sqrt(((nll ** 2).mean() - nll.mean() ** 2) / (len(nll) - 1))
        assert res.n_chunk == n_chunk and res.count == n_chunk * 15 == len(nll)
        np.testing.assert_allclose(res.nll, nll, rtol=1e-5, atol=1e-5)
        assert res.ppl == pytest.approx(ppl, rel=1e-6)
        assert res.ppl_err == pytest.approx(err, rel=1e-5)
        assert res.chunk_ppl[-1] == pytest.approx(ppl, rel=1e-6)
        assert res.chunk_ppl[0] == pytest.approx(math.exp(nll[:15].mean()), rel=1e-6)
    # BOS matters (the test can tell), and --chunks limits the chunks
    assert P.perplexity(model, tokens=tokens, n_ctx=n_ctx, bos=None, n_threads=2).ppl != pytest.approx(
        P.perplexity(model, tokens=tokens, n_ctx=n_ctx, bos=5, n_threads=2).ppl, rel=1e-4)
    assert P.perplexity(model, tokens=tokens, n_ctx=n_ctx, bos=None, n_chunks=1, n_threads=2).count == 15


def test_batching_does_not_change_the_result(tiny):
    """Several decodes per chunk (-b < -c) and several chunks per decode (-b = 2c) score the same."""
    model, _, tokens = tiny
    ref = P.perplexity(model, tokens=tokens, n_ctx=32, bos=None, n_threads=2, type_kv="f32")
    for n_batch in (8, 20, 64):
        r = P.perplexity(model, tokens=tokens, n_ctx=32, n_batch=n_batch, bos=None, n_threads=2,
                         type_kv="f32")
        np.testing.assert_allclose(r.nll, ref.nll, rtol=1e-4, atol=1e-4)


# ---- base file and KL divergence ------------------------------------------------------------------

def test_base_file_round_trip(tiny, tmp_path):
    model, _, tokens = tiny
    base = tmp_path / "base.bin"
    res = P.perplexity(model, tokens=tokens, n_ctx=32, bos=None, n_threads=2, type_kv="f32",
                       kl_divergence_base=base)
    nv = 2 * ((model.n_vocab + 1) // 2) + 4
    assert base.stat().st_size == 20 + 4 * 3 * 32 + 3 * 15 * nv * 2
    raw = base.read_bytes()
    assert raw[:8] == b"_logits_"
    assert np.frombuffer(raw[8:20], "<i4").tolist() == [32, model.n_vocab, 3]
    assert np.array_equal(np.frombuffer(raw[20:20 + 4 * 96], "<i4"), tokens[:96])
    nll_base = []
    with P.BaseFile(base) as bf:
        assert (bf.n_ctx, bf.n_vocab, bf.n_chunk) == (32, model.n_vocab, 3)
        logits = _chunk_logits_numpy(model, tokens, 32, 3, None)
        for c in range(3):
            lp, nxt = _scored(_log_softmax(logits[c]), tokens[c * 32:(c + 1) * 32], 32)
            got = bf.log_probs(c)
            head = np.ascontiguousarray(bf.rows(c)[:, :4]).view(np.float32)
            scale, floor = head[:, :1], head[:, 1:2]
            # the stored log-probs: within half a step of the exact ones, those more than 16 nats
            # below the top one raised to that floor
            assert np.all(np.abs(got - np.maximum(lp, floor)) < scale * 0.51 + 2e-5)
            assert (lp < floor - 1).any()
            nll_base.append(-np.maximum(lp, floor)[np.arange(len(nxt)), nxt])
    nll_base = np.concatenate(nll_base)
    kld = P.kl_divergence(model, base, tokens=tokens, n_threads=2, type_kv="f32")
    assert kld.count == 45
    assert abs(kld.kld_mean) < 2e-5 and kld.kld_max < 1e-4        # float32 rounding, as llama.cpp's
    assert kld.same_top_p == 1.0
    assert kld.ppl == pytest.approx(res.ppl, rel=1e-6)
    assert kld.ppl_base == pytest.approx(math.exp(nll_base.mean()), rel=1e-4)
    assert abs(kld.dp_mean) < 1e-4 and kld.rms_dp < 1e-3


def test_kl_divergence_of_two_models_equals_numpy(tiny, tmp_path):
    model_a, model_b, tokens = tiny
    base = tmp_path / "a.bin"
    P.perplexity(model_a, tokens=tokens, n_ctx=32, bos=None, n_threads=2, type_kv="f32",
                 kl_divergence_base=base)
    r = P.kl_divergence(model_b, base, n_threads=2, bos=None, type_kv="f32")
    la = _chunk_logits_numpy(model_a, tokens, 32, 3, None)
    lb = _chunk_logits_numpy(model_b, tokens, 32, 3, None)
    kld, dp, same, nll_a, nll_b = [], [], [], [], []
    for c in range(3):
        toks = tokens[c * 32:(c + 1) * 32]
        pa, nxt = _scored(_log_softmax(la[c]), toks, 32)
        pb, _ = _scored(_log_softmax(lb[c]), toks, 32)
        rows = np.arange(len(nxt))
        kld.append((np.exp(pa) * (pa - pb)).sum(axis=1))
        dp.append(np.exp(pb[rows, nxt]) - np.exp(pa[rows, nxt]))
        same.append(pa.argmax(axis=1) == pb.argmax(axis=1))
        # the base file keeps log-probs down to 16 nats below the top one: lower ones read as that
        nll_a.append(-np.maximum(pa[rows, nxt], np.maximum(pa.min(axis=1), pa.max(axis=1) - 16)))
        nll_b.append(-pb[rows, nxt])
    kld, dp, same = np.concatenate(kld), np.concatenate(dp), np.concatenate(same)
    nll_a, nll_b = np.concatenate(nll_a), np.concatenate(nll_b)
    assert kld.mean() > 0.5                                   # the models really differ
    assert r.count == 45
    np.testing.assert_allclose(r.kld, np.sort(kld), atol=2e-3, rtol=1e-3)
    assert r.kld_mean == pytest.approx(kld.mean(), rel=1e-3)
    assert r.kld_err == pytest.approx(kld.std() / math.sqrt(len(kld) - 1), rel=1e-2)
    assert r.kld_median == pytest.approx(np.median(kld), rel=1e-3, abs=1e-3)
    assert r.kld_percentile(0.9) == pytest.approx(np.percentile(kld, 90), rel=1e-3, abs=1e-3)
    np.testing.assert_allclose(r.dp, np.sort(dp), atol=1e-4)
    assert r.rms_dp == pytest.approx(math.sqrt((dp ** 2).mean()), rel=1e-3, abs=1e-5)
    assert r.same_top_p == pytest.approx(same.mean())
    assert r.same_top_p_err == pytest.approx(math.sqrt(same.mean() * (1 - same.mean()) / (len(same) - 1)))
    assert r.ppl == pytest.approx(math.exp(nll_b.mean()), rel=1e-5)
    assert r.ppl_base == pytest.approx(math.exp(nll_a.mean()), rel=1e-3)
    assert r.ppl_ratio == pytest.approx(math.exp(nll_b.mean() - nll_a.mean()), rel=1e-3)


def test_compress_corner_cases():
    """A row of equal logits: scale 0, every q 0; a row wider than 16 nats: clamped at max − 16."""
    rows = P.compress_log_probs(np.array([[1.5] * 5, [0.0, 20.0, -30.0, 10.0, 4.0]], dtype=np.float32))
    assert rows.shape == (2, 2 * 3 + 4)
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    assert head[0, 0] == 0 and head[0, 1] == pytest.approx(-math.log(5), rel=1e-6)
    assert rows[0, 4:].tolist() == [0] * 6
    assert head[1, 0] == np.float32(16) / np.float32(65535)
    assert rows[1, 4:9].tolist() == [0, 65535, 0, round(6 / 16 * 65535), 0]
    lp = P.decompress_log_probs(rows, 5)
    rest = math.exp(-10) + math.exp(-16) + math.exp(-50) + math.exp(-20)
    assert lp[1, 1] == pytest.approx(-math.log1p(rest), abs=1e-6)


# ---- against llama-perplexity -------------------------------------------------------------------

def test_our_base_file_is_llama_cpp_s(models, text, tmp_path, llama):
    theirs = _unzip("exact_base.bin.gz", tmp_path).read_bytes()
    ours_path = tmp_path / "ours.bin"
    res = P.perplexity(str(models["exact"]), text, n_ctx=N_CTX, n_threads=2, kl_divergence_base=ours_path)
    ours = ours_path.read_bytes()
    assert len(ours) == len(theirs)
    head = 20 + 4 * 3 * N_CTX
    assert ours[:head] == theirs[:head], "header or tokens differ (tokenizer changed?)"
    nv = 2 * ((N_VOCAB + 1) // 2) + 4
    a = np.frombuffer(ours[20 + 4 * 3 * N_CTX:], "<u2").reshape(-1, nv)
    b = np.frombuffer(theirs[20 + 4 * 3 * N_CTX:], "<u2").reshape(-1, nv)
    assert np.array_equal(a[:, :2], b[:, :2]), "scale differs"
    assert np.array_equal(a[:, 4:], b[:, 4:]), "quantized log-probs differ"
    min_lp_ulps = np.abs(a[:, 2:4].copy().view("<i4").astype(np.int64) - b[:, 2:4].copy().view("<i4"))
    assert min_lp_ulps.max() <= 1
    assert (min_lp_ulps == 0).mean() > 0.8, f"{(min_lp_ulps == 0).mean():.0%} of min_log_prob equal"
    # the fixture exercises both kinds of row: the range clamped at 16 nats and not
    logp = P.decompress_log_probs(b, N_VOCAB)
    spread = logp.max(axis=1) - logp.min(axis=1)
    assert (spread > 15.99).any() and (spread < 15.9).any()
    # and our perplexity is the one llama-perplexity printed
    want = llama["exact"]
    assert f"{res.ppl:.4f} +/- {res.ppl_err:.5f}" == f"{want['ppl']:.4f} +/- {want['ppl_err']:.5f}"


def test_kl_divergence_matches_llama_cpp(models, text, tmp_path, llama):
    base = _unzip("exact_base.bin.gz", tmp_path)
    lines: list[str] = []
    r = P.kl_divergence(str(models["exact1"]), base, text, n_ctx=N_CTX, n_threads=2,
                        on_chunk=lambda i, c: lines.append(_chunk_line(i, c)))
    assert r.kld_mean > 0.05
    theirs = llama["exact1_vs_exact"]["chunk_lines"]
    assert len(lines) == len(theirs) == 3
    for ours, line in zip(lines, theirs):
        if ours != line:  # sums in another order may move a last digit, not more
            for a, b in zip(ours.split(), line.split()):
                digits = len(b.split(".")[-1])
                assert a == b or float(a) == pytest.approx(float(b), abs=1.01 * 10.0 ** -digits), (ours, line)


def _chunk_line(i: int, c: dict) -> str:
    """llama-perplexity's per-chunk KLD line, from our running numbers."""
    return (f"{i:4d}    {c['ppl']:9.4f} ± {c['ppl_err']:9.4f}    {c['ln_ppl_ratio']:10.5f} ± "
            f"{c['ln_ppl_ratio_err']:10.5f}    {c['kld_mean']:10.5f} ± {c['kld_err']:10.5f}    "
            f"{100 * c['rms_dp']:6.3f} ± {100 * c['rms_dp_err']:6.3f} %    {100 * c['same_top_p']:6.3f} ± "
            f"{100 * c['same_top_p_err']:6.3f} %")


def test_reads_llama_cpp_base_with_bos(models, text, tmp_path, llama):
    base = _unzip("random_bos_base.bin.gz", tmp_path)
    with P.BaseFile(base) as bf:
        tokens = bf.tokens.copy()
    assert tokens[0] == 268 and (tokens[1:] != 268).all()        # BOS once, in the text's tokens
    r = P.kl_divergence(str(models["random_bos"]), base, text, n_threads=2, type_kv="f32")
    assert r.count == 30 and r.same_top_p == 1.0
    assert r.kld_max < 1e-4, "far from llama.cpp's log-probs: tiny_models.py's random weights changed?"
    assert r.ppl == pytest.approx(llama["random_bos"]["ppl"], rel=1e-3)
    assert r.ppl_base == pytest.approx(llama["random_bos"]["ppl"], rel=1e-4)
    # without the BOS that starts every chunk, the logits would be far from llama.cpp's
    no_bos = P.kl_divergence(str(models["random_bos"]), base, n_threads=2, bos=None)
    assert no_bos.kld_mean > max(0.01, 100 * abs(r.kld_mean))


# ---- errors and the command line --------------------------------------------------------------------

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from dspark_ggml.cli import main

    rc = main(["perplexity", *argv, "-t", "2", "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_perplexity_and_kl_divergence(models, text, tmp_path, capsys, llama):
    base = tmp_path / "b.bin"
    rc, out, _ = _cli(capsys, "-m", str(models["exact"]), "-f", str(DATA / "text.txt"), "-c", "32",
                      "--kl-divergence-base", str(base))
    assert rc == 0 and base.exists()
    assert f"Final estimate: PPL = {llama['exact']['ppl']:.4f} +/- " in out
    rc, out, _ = _cli(capsys, "-m", str(models["exact1"]), "-f", str(DATA / "text.txt"), "--kl-divergence",
                      "--kl-divergence-base", str(base), "--json")
    d = json.loads(out)
    assert rc == 0 and d["n_ctx"] == 32 and d["count"] == 45
    for key in ("ppl", "ppl_err", "ppl_base", "kld_mean", "kld_err", "kld_median", "same_top_p",
                "same_top_p_err", "rms_dp", "dp_mean", "kld_percentiles"):
        assert d[key] is not None, key
    rc, out, _ = _cli(capsys, "-m", str(models["exact1"]), "--kl-divergence",
                      "--kl-divergence-base", str(base))
    assert rc == 0 and "Mean    KLD:" in out and "Same top p:" in out and "Mean PPL(Q)/PPL(base)" in out


def test_errors(models, tmp_path, capsys, text):
    exact = str(models["exact"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    short = tmp_path / "short.txt"
    short.write_text("too short\n")
    good_base = tmp_path / "good.bin"
    P.perplexity(exact, text, n_ctx=N_CTX, n_threads=2, kl_divergence_base=good_base)
    raw = good_base.read_bytes()
    bad_magic = tmp_path / "magic.bin"
    bad_magic.write_bytes(b"_logitz_" + raw[8:])
    truncated = tmp_path / "trunc.bin"
    truncated.write_bytes(raw[:-3])
    other_vocab = tmp_path / "vocab.bin"
    other_vocab.write_bytes(raw[:12] + np.int32(N_VOCAB + 2).tobytes() + raw[16:])

    with pytest.raises(InvalidArgumentError, match="empty"):
        P.read_text(empty)
    with pytest.raises(FileAccessError, match="no such text file"):
        P.read_text(tmp_path / "missing.txt")
    with pytest.raises(InvalidArgumentError, match=r"needs at least 64 \(2 chunks\)"):
        P.perplexity(exact, "too short", n_ctx=N_CTX)
    with pytest.raises(InvalidArgumentError, match="training context"):
        P.perplexity(exact, text, n_ctx=4096)
    with pytest.raises(FileFormatError, match="not a KL-divergence base file"):
        P.BaseFile(bad_magic)
    with pytest.raises(FileFormatError, match="truncated"):
        P.BaseFile(truncated)
    with pytest.raises(FileFormatError, match="truncated"):  # its rows are sized for the header's vocabulary
        P.BaseFile(other_vocab)
    with pytest.raises(InvalidArgumentError, match="vocabulary of 272 tokens.*has 300"):
        import dspark_ggml as dg

        other = tmp_path / "other.gguf"
        write_target(other, TargetConfig(n_vocab=300), seed=1, return_weights=False)
        P.kl_divergence(dg.Model(str(other)), good_base)
    with pytest.raises(InvalidArgumentError, match="context of 32 tokens, not 64"):
        P.kl_divergence(exact, good_base, n_ctx=64)
    with pytest.raises(InvalidArgumentError, match="tokens are not"):
        P.kl_divergence(exact, good_base, "Another text entirely. " * 10)

    text_file = str(DATA / "text.txt")
    for argv, message in (
        (["-m", exact, "-f", str(empty)], "is empty"),
        (["-m", exact, "-f", str(short), "-c", "32"], "needs at least 64"),
        (["-m", exact, "-f", str(tmp_path / "missing.txt")], "no such text file"),
        (["-m", exact, "-f", text_file, "-c", "4096"], "training context"),
        (["-m", exact, "--kl-divergence", "--kl-divergence-base", str(bad_magic)], "not a KL-divergence"),
        (["-m", exact, "--kl-divergence", "--kl-divergence-base", str(truncated)], "truncated"),
        (["-m", exact, "--kl-divergence", "--kl-divergence-base", str(tmp_path / "none.bin")], "no such"),
        (["-m", exact, "--kl-divergence"], "needs the base file"),
        (["-m", exact, "-f", text_file, "-ctk", "f32", "-ctv", "f16"], "disagree"),
        (["-m", str(tmp_path / "none.gguf"), "-f", text_file], "no such model file"),
    ):
        rc, out, err = _cli(capsys, *argv)
        assert rc == 1, argv
        assert message in err and err.count("\n") == 1, (argv, err)


# ---- regenerating the fixtures ------------------------------------------------------------------------

_FLOAT = r"(-?\d+\.\d+|nan|-?inf)"


def _llama(bin_dir: Path, *args: str, until: str) -> str:
    """Run llama-perplexity; its log. Its logger writes from a thread that the exit can cut short,
    losing the last lines now and then: run again until ``until`` is in the log."""
    log = Path(args[args.index("--log-file") + 1])
    for _ in range(10):
        log.unlink(missing_ok=True)
        subprocess.run([str(bin_dir / "llama-perplexity"), *args], check=True, capture_output=True)
        text = log.read_text()
        if until in text:
            return text
    raise RuntimeError(f"llama-perplexity's log never had {until!r}:\n{text}")


def regenerate(bin_dir: Path) -> None:
    import tempfile

    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d_:
        d = Path(d_)
        exact, exact1 = write_exact_model(d / "exact.gguf"), write_exact_model(d / "exact1.gguf", 1)
        rnd = write_random_bos_model(d / "random_bos.gguf")
        common = ["-f", str(DATA / "text.txt"), "-c", str(N_CTX), "-b", str(N_CTX), "-t", "2",
                  "-ctk", "f32", "-ctv", "f32", "--log-file", str(d / "log.txt")]
        record: dict = {"llama_cpp": "llama-perplexity built from llama-cpp-python 0.3.36's vendor/llama.cpp",
                        "n_ctx": N_CTX}
        for name, model, more in (("exact", exact, []), ("random_bos", rnd, ["--chunks", "2"])):
            args = ["-m", str(model), *common, *more, "--kl-divergence-base", str(d / f"{name}.bin")]
            log = _llama(bin_dir, *args, until="Final estimate")
            m = re.search(rf"Final estimate: PPL = {_FLOAT} \+/- {_FLOAT}", log)
            assert m, log
            record[name] = {"command": "llama-perplexity " + " ".join(_rel(a, d) for a in args),
                            "ppl": float(m.group(1)), "ppl_err": float(m.group(2))}
            packed = gzip.compress((d / f"{name}.bin").read_bytes(), 9, mtime=0)
            (DATA / f"{name}_base.bin.gz").write_bytes(packed)
        args = ["-m", str(exact1), *common, "--kl-divergence", "--kl-divergence-base", str(d / "exact.bin")]
        log = _llama(bin_dir, *args, until="\n   3 ")
        lines = [ln.rstrip() for ln in log.splitlines() if re.match(r"^\s+\d+\s+-?\d", ln)]
        assert lines, log
        record["exact1_vs_exact"] = {"command": "llama-perplexity " + " ".join(_rel(a, d) for a in args),
                                     "chunk_lines": lines}
        (DATA / "llama.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def _rel(arg: str, tmp: Path) -> str:
    return arg.replace(str(tmp) + "/", "").replace(str(ROOT) + "/", "")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--regenerate":
        sys.exit("usage: python tests/test_perplexity.py --regenerate DIR_OF_LLAMA_CPP_BINARIES")
    regenerate(Path(sys.argv[2]))
