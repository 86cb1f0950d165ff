"""`dspark-ggml check`: a draft converted with the wrong block layout is caught."""
from __future__ import annotations

from dspark_ggml.check import check_draft, verdict
from tests.tiny_pair import DRAFT_PATH, TARGET_PATH
from tests.gguf_edit import rewrite_gguf


def test_right_conversion_passes_and_wrong_layout_is_caught(tmp_path):
    rows = check_draft(TARGET_PATH, DRAFT_PATH, n_threads=1, max_tokens=32)
    assert [r.variant for r in rows][:2] == ["as converted", "1+N layout"]
    assert rows[0].tau > 2.5 and verdict(rows) is None

    wrong = rewrite_gguf(DRAFT_PATH, tmp_path / "wrong-layout.gguf", set_keys={"dflash.sample_from_anchor": False})
    rows = check_draft(TARGET_PATH, wrong, n_threads=1, max_tokens=32)
    warning = verdict(rows)
    assert rows[0].tau < rows[1].tau
    assert warning is not None and "--sample-from-anchor true" in warning
