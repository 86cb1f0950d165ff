"""The CLI's tool commands: info --system, check, bench (on the tiny pair of the tests)."""
from __future__ import annotations

import json

from dspark_ggml.cli import main
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH


def test_info_lists_the_system_and_devices(capsys):
    assert main(["info", "--system"]) == 0
    out = capsys.readouterr().out
    assert "ggml" in out and "device 0:" in out and "CPU" in out


def test_check_prints_every_variant(capsys):
    assert main(["check", TARGET_PATH, DRAFT_PATH, "-t", "1", "-n", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["variant"] for r in d["rows"]][0] == "as converted" and d["warning"] is None
    assert len(d["rows"]) >= 3


def test_bench_compares_target_only_and_speculative(capsys):
    assert main(["bench", "-t", "1", "-np", "2", "-n", "24", "--temp", "0", "0.7", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["temperature"], r["draft_mode"]) for r in rows] == [(0.0, "greedy"), (0.7, "greedy"), (0.7, "probabilistic")]
    greedy = rows[0]
    assert greedy["mean_accepted_length"] > 1.3 and greedy["target_tok_s"] > 0 and greedy["spec_tok_s"] > 0
