"""Run the whole demo-pair pipeline end to end with fixed seeds.

    /path/to/python tools/demo_pair/run_all.py [--out /tmp/demo_pair_out] [--threads 2] [--from STEP]

Steps: tokenizer -> target -> gen_data -> train_draft -> export -> evaluate (torch draft, and the
reduced-vocabulary speculators export) -> convert (GGUFs into python/dspark_ggml/demo/).
Each step is a subprocess of the same interpreter; stage wall times go to OUT/timings.json.
Needs torch==2.13.0, transformers>=5, tokenizers, safetensors, numpy (and gguf for convert).

glibc's malloc returns large freed blocks to the kernel, which makes torch re-fault fresh pages on
every op; the MALLOC_* settings below keep them, which is ~15-30 % faster here. They change no result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = ["tokenizer", "target", "gen_data", "train_draft", "export", "evaluate", "evaluate_reduced",
         "convert"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/demo_pair_out")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--from", dest="start", default="tokenizer", choices=STEPS)
    ap.add_argument("--to", dest="stop", default="convert", choices=STEPS)
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env.update({"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296",
                "MALLOC_TOP_PAD_": "268435456", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": str(args.threads)})
    py = sys.executable
    th = ["--threads", str(args.threads)]
    cmds = {
        "tokenizer": ["train_tokenizer.py"],
        "target": ["target.py"] + th,
        "gen_data": ["gen_data.py"] + th,
        "train_draft": ["train_draft.py"] + th,
        "export": ["export.py"],
        "evaluate": ["evaluate.py"] + th,
        "evaluate_reduced": ["evaluate.py", "--draft", os.path.join(args.out, "draft-dspark-reduced"),
                             "--tag", "_reduced", "--speed", "0"] + th,
        "convert": ["convert_all.py"],
    }
    os.makedirs(args.out, exist_ok=True)
    tpath = os.path.join(args.out, "timings.json")
    timings = json.load(open(tpath)) if os.path.exists(tpath) else {}
    sel = STEPS[STEPS.index(args.start):STEPS.index(args.stop) + 1]
    for step in sel:
        cmd = [py, os.path.join(HERE, cmds[step][0]), "--out", args.out] + cmds[step][1:]
        print(f"== {step}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, cwd=HERE, env=env)
        timings[step] = round(time.time() - t0, 1)
        timings["total"] = round(sum(v for k, v in timings.items() if k in STEPS), 1)
        with open(tpath, "w") as f:
            json.dump(timings, f, indent=2)
        print(f"== {step} done in {timings[step]:.0f}s (total so far {timings['total']:.0f}s)", flush=True)
    if "convert" in sel:  # re-run pair.json so it carries the final timings
        subprocess.run([py, os.path.join(HERE, "convert_all.py"), "--out", args.out],
                       check=True, cwd=HERE, env=env)


if __name__ == "__main__":
    main()
