"""Which part of a device's graphs makes a verify row differ from its decode step: the rows of batches
of 1..17 and 33 tokens against the same rows decoded alone, per weight type, with the device's
default routes, with only its matmul route (ggml's attention) and with only attention in sequence
order (ggml's matmuls). A table of differing rows per mode: 0 everywhere in the default column is
what lossless greedy speculation needs (tests/test_devices.py checks that column).

    python tools/device_invariance.py [--device N] [--types f16 q8_0 ...] [--model GGUF ...]

--model checks the given files instead of the tiny test target (rows of real widths: a kernel may
split a row of 1024 values among its threads as it does not split one of 256).

The device is the first non-CPU one unless --device says otherwise (with DSPARK_DEVICE_RULES=cuda the
CPU runs the graphs a CUDA device gets). Each mode runs in a fresh process (the switches are read
once per process).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {
    "default": {},
    "matmul route only": {"DSPARK_DEVICE_ATTENTION": "ggml"},
    "attention only": {"DSPARK_DEVICE_MATMUL": "ggml"},
    "ggml": {"DSPARK_DEVICE_ATTENTION": "ggml", "DSPARK_DEVICE_MATMUL": "ggml"},
}
TYPES = ["f32", "f16", "q8_0", "q4_0", "q4_K", "q6_K", "iq4_nl"]
BATCHES = list(range(1, 18)) + [33]
PREFIX = 40


def worker(path: Path, device: int) -> None:
    import numpy as np
    from dspark_ggml.model import Model
    from tests.test_devices import _rows_alone_and_in_batches

    tokens = [int(t) for t in np.random.default_rng(7).integers(0, 256, PREFIX + max(BATCHES))]
    model = Model(path, device=device)
    differ = _rows_alone_and_in_batches(model, tokens, BATCHES, PREFIX)
    print(json.dumps({"rows": len(differ), "batches": sorted({n for n, _ in differ})}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=-1)
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--model", nargs="+", default=[])
    ap.add_argument("--worker", metavar="GGUF")
    args = ap.parse_args()
    if args.device < 0:
        from dspark_ggml.system import devices

        args.device = next((d.index for d in devices() if d.type != "cpu"), -1)
        if args.device < 0:
            raise SystemExit("no device besides the CPU (pass --device 0 with DSPARK_DEVICE_RULES=cuda to run CUDA's graphs on the CPU)")
    if args.worker:
        worker(Path(args.worker), args.device)
        return 0

    files = {Path(m).name: Path(m) for m in args.model}
    if not files:
        from dspark_ggml.quantize import quantize_gguf
        from tests.test_devices import INV_TARGET
        from tests.tiny_models import write_target

        folder = Path(tempfile.mkdtemp(prefix="invariance-"))
        write_target(folder / "f32.gguf", INV_TARGET, seed=3)
        for t in args.types:
            if t != "f32":
                quantize_gguf(folder / "f32.gguf", folder / f"{t}.gguf", t, pure=True, progress=False)
            files[t] = folder / f"{t}.gguf"
    rows = []
    for t, path in files.items():
        cells = [t]
        for env in MODES.values():
            out = subprocess.run([sys.executable, __file__, "--device", str(args.device), "--worker", str(path)],
                                 env={**os.environ, **env}, capture_output=True, text=True)
            if out.returncode != 0:
                cells.append("failed: " + (out.stderr.strip().splitlines() or ["?"])[-1][:60])
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            cells.append(f"{r['rows']}" + (f" (n = {','.join(map(str, r['batches'][:6]))})" if r["rows"] else ""))
        rows.append(cells)
    print(f"rows differing from their decode step, batches {BATCHES[0]}..{BATCHES[-2]} and {BATCHES[-1]} at "
          f"positions {PREFIX}.., device {args.device}")
    widths = [max(len(str(c)) for c in col) for col in zip(["type", *MODES], *rows)]
    for r in [["type", *MODES], ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
