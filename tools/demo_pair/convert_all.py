"""Convert the demo pair with the project's converter and place the GGUFs as package data.

    python tools/demo_pair/convert_all.py --out /tmp/demo_pair_out [--dest tests/data/tiny_pair]

Writes target.gguf (from OUT/target), draft-dspark.gguf (from OUT/draft-dspark, DeepSpec format)
and draft-dspark-reduced.gguf (from OUT/draft-dspark-reduced, speculators format with d2t), all q8_0,
plus pair.json (training facts and the torch evaluation results).
"""

from __future__ import annotations

import argparse
import os
import sys

from common import Timer, log, read_json, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/demo_pair_out")
    ap.add_argument("--dest", default=os.path.join(REPO, "tests", "data", "tiny_pair"))
    ap.add_argument("--outtype", default="q8_0")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(REPO, "python"))
    from dspark_ggml.convert import convert

    timer = Timer()
    tdir = os.path.join(args.out, "target")
    os.makedirs(args.dest, exist_ok=True)
    jobs = [
        (tdir, "target.gguf", None),
        (os.path.join(args.out, "draft-dspark"), "draft-dspark.gguf", tdir),
        (os.path.join(args.out, "draft-dspark-reduced"), "draft-dspark-reduced.gguf", tdir),
    ]
    sizes = {}
    for src, name, tgt in jobs:
        dst = os.path.join(args.dest, name)
        convert(src, dst, outtype=args.outtype, target_model_dir=tgt, force=True, progress=False)
        sizes[name] = os.path.getsize(dst)
        log(f"{name}: {sizes[name] / 1e6:.2f} MB")
    info = {"outtype": args.outtype, "gguf_bytes": sizes}
    for key, fn in [("corpus", "corpus.json"), ("target_training", "target_train.json"),
                    ("draft_data", "gen_data.json"), ("draft_training", "draft_train.json"),
                    ("export", "export.json"), ("eval_torch", "eval.json"),
                    ("eval_torch_reduced", "eval_reduced.json"), ("timings", "timings.json"),
                    ("bench_ggml", "bench_ggml.json")]:
        p = os.path.join(args.out, fn)
        if os.path.exists(p):
            obj = read_json(p)
            if key == "corpus":
                obj = {k: v for k, v in obj.items() if k != "stdlib"}
            for drop in ("history",):
                if isinstance(obj, dict):
                    obj.pop(drop, None)
            info[key] = obj
    write_json(os.path.join(args.dest, "pair.json"), info)
    log(f"converted in {timer():.1f}s; total {sum(sizes.values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
