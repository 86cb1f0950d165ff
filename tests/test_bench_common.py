"""The benchmarks' shared helpers (bench/common.py): the prompt sets found from any install (the
checkout's ../shared/data/prompts, or --prompts DIR), and every table headed by the machine it ran on."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import common  # noqa: E402


@pytest.fixture
def prompts_dir_restored():
    saved = common.PROMPTS_DIR
    yield
    common.PROMPTS_DIR = saved


def test_prompts_flag_points_the_shared_sets_elsewhere(tmp_path: Path, prompts_dir_restored):
    turns = ["first question?", "second question?", "third question?"]
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps({"turns": [t, "a follow-up"]}) + "\n" for t in turns))
    ap = argparse.ArgumentParser()
    common.add_prompts_arg(ap)
    args = ap.parse_args(["--prompts", str(tmp_path)])
    assert args.prompts == tmp_path
    assert common.prompt_texts("gsm8k", 2) == turns[:2]
    assert common.prompt_texts("gsm8k", 1, last=True) == turns[-1:]
    with pytest.raises(SystemExit, match="--prompts DIR"):
        common.prompt_texts("humaneval", 1)  # not in that folder


def test_the_default_is_the_checkouts_shared_folder():
    assert common.PROMPTS_DIR == Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"


def test_the_first_table_names_the_machine(capsys):
    common._machine_shown = False
    common.print_table(["a", "b"], [[1, 2.5]])
    common.print_table(["c"], [[3]])
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"CPU: .+, \d+ cores; reports .*; our kernels: (scalar|avx2|avx512_vnni|amx_int8)$", lines[0])
    assert sum(line.startswith("CPU: ") for line in lines) == 1  # once per process
    assert lines[1] == "| a | b   |" and lines[3] == "| 1 | 2.5 |"
