"""Mutated GGUFs never crash or hang the process: each mutant (structure-aware, see
tests/gguf_mutate.py) is loaded and, if it loads, generates a few tokens greedy and sampled in a
worker subprocess with a memory and time limit (tests/gguf_fuzz.py). A signal or a hang fails the test with the mutant
saved; a Python exception that is not a DSparkError (no clear message) fails it too.

A fixed seed and a few hundred mutants here; `python tools/fuzz_gguf.py --n 20000` for long runs.
"""
from __future__ import annotations

import os

import pytest

from tests.tiny_models import TargetConfig, write_target
from tests.gguf_fuzz import Base, default_bases, run
from tests.gguf_mutate import mutate, parse, serialize

SEED = 13


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[Base]:
    return default_bases(tmp_path_factory.mktemp("fuzz"))


def test_the_mutator_round_trips_and_is_deterministic(bases):
    for b in bases:
        data = b.path.read_bytes()
        assert serialize(parse(data))[0] == data
    data = bases[0].path.read_bytes()
    assert mutate(data, SEED, 5) == mutate(data, SEED, 5)
    assert len({mutate(data, SEED, i) for i in range(40)}) > 30


def test_mutated_ggufs_never_crash_or_hang(bases, tmp_path):
    n = int(os.environ.get("DSPARK_FUZZ_N", "50"))  # per base: 450 in all
    report = run(bases, n, SEED, tmp_path / "failures", timeout_s=60)
    assert report.n == n * len(bases)
    assert not report.failures and not report.pyerrors, report.summary()
    refused = sum(v for k, v in report.outcomes.items() if k.startswith("refused"))
    assert report.outcomes["ok"] > 0.1 * report.n and refused > 0.3 * report.n, report.summary()


def test_the_runner_catches_a_crash_and_saves_the_mutant(tmp_path, monkeypatch):
    """The harness itself must be able to fail: a worker that dies by a signal is a failure."""
    import tests.gguf_fuzz as fuzz

    tcfg = TargetConfig(n_vocab=300, n_layer=1)
    write_target(tmp_path / "t.gguf", tcfg, seed=1)
    script = tmp_path / "crashing_worker.py"
    script.write_text("import os, signal\nprint('start 3', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(fuzz, "__file__", str(script))
    report = fuzz.run([Base(tmp_path / "t.gguf", "target")], 4, SEED, tmp_path / "failures", timeout_s=10)
    # killed by the signal, or (under AddressSanitizer, which catches it) exited with its error status
    assert report.outcomes["crash"] == 1
    assert "t.gguf#3: killed by signal 11" in report.failures[0] or "t.gguf#3: exited with 1" in report.failures[0]
    saved = tmp_path / "failures" / f"t-seed{SEED}-3.gguf"
    assert saved.read_bytes() == mutate((tmp_path / "t.gguf").read_bytes(), SEED, 3)
