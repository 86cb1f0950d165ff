"""The CPU's weight matmuls, kernel by kernel (dspark_cpu_matmul): every column of a batch bit for bit
the column computed alone, and each result against numpy's product of the dequantized weights.

Block types (q8_0, q4_0, q4_1, q5_0, q5_1) on a CPU with AVX2 or AVX-512 VNNI take the `blocks` kernel
(dspark-matmul-blocks.h), which multiplies by the column quantized to q8_0: its reference is the
float64 product with that column, close to float rounding. Other types are checked for batch
invariance and against the float product within their activation's quantization error. Each route
this machine can run is forced in turn, and a lesser instruction set through DSPARK_CPU_ISA.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dspark_ggml.errors import InvalidArgumentError, UnsupportedError
from dspark_ggml.quant import cpu_isa, cpu_matmul, dequantize, quantize

BLOCK_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
BLOCKS_ISAS = ("avx2", "avx512_vnni", "amx_int8")  # the instruction sets that run the blocks kernel
OTHER_TYPES = ["f32", "f16", "bf16", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs"]
FLOAT_TYPES = ["f32", "f16", "bf16"]
COLUMNS = list(range(1, 18)) + [33]


def routes_here(type_name: str) -> list[str]:
    """The routes this CPU runs for the type: the runtime's own choice, the single-column kernel
    per column, our float kernel, and the blocks kernel where the CPU has it."""
    routes = ["auto", "rows"]
    if type_name in FLOAT_TYPES and cpu_isa() != "scalar":
        routes.append("own")  # our float kernel on every batch (the runtime hands it up to 16 columns)
    if type_name in BLOCK_TYPES and cpu_isa() in BLOCKS_ISAS:
        routes += ["blocks", "blocks_plain"]  # the packed layout (a model's weights) and the plain one
    return routes


def random_case(type_name: str, n_rows: int, n_per_row: int, n_cols: int, seed: int):
    rng = np.random.default_rng(seed)
    w = quantize(rng.standard_normal((n_rows, n_per_row)).astype(np.float32) * 0.2, type_name)
    x = rng.standard_normal((n_cols, n_per_row)).astype(np.float32)
    return w, dequantize(w, type_name, (n_rows, n_per_row)).astype(np.float64), x


def q8_0_columns(x: np.ndarray) -> np.ndarray:
    """The columns as the blocks kernel sees them: quantized to q8_0 (ggml's quantizer), as floats."""
    return dequantize(quantize(x, "q8_0"), "q8_0", x.shape).astype(np.float64)


def assert_every_column_as_alone(w, type_name, x, route, y):
    for c in range(x.shape[0]):
        alone, _ = cpu_matmul(w, type_name, x.shape[1], x[c:c + 1], route=route)
        assert np.array_equal(alone[0].view(np.uint32), y[c].view(np.uint32)), f"{type_name} {route}: column {c} of {x.shape[0]}"


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
@pytest.mark.parametrize("n_rows,n_per_row", [(1, 32), (15, 96), (17, 608), (50, 64), (33, 1536)])
def test_block_types_against_numpy_and_alone(type_name: str, n_rows: int, n_per_row: int):
    for route in routes_here(type_name):
        for n_cols in (1, 2, 7, 9, 16, 17, 33):
            w, wd, x = random_case(type_name, n_rows, n_per_row, n_cols, seed=n_rows * 1000 + n_cols)
            y, taken = cpu_matmul(w, type_name, n_per_row, x, route=route, threads=2)
            ref = q8_0_columns(x) @ wd.T
            scale = np.abs(q8_0_columns(x)) @ np.abs(wd).T  # what float rounding is relative to
            tol = 1e-6 if taken == "blocks" else 1e-3       # (ggml's q4_1 / q5_1 keep d·Σq in f16)
            assert np.all(np.abs(y - ref) <= tol * scale + 1e-30), f"{type_name} {taken} n={n_cols}"
            if n_cols in (9, 17, 33):
                assert_every_column_as_alone(w, type_name, x, route, y)


@pytest.mark.parametrize("type_name", BLOCK_TYPES + OTHER_TYPES)
def test_every_type_every_column_count_is_the_column_alone(type_name: str):
    n_per_row = 512 if type_name[-1] in "K" or type_name == "iq4_xs" else 608
    w, wd, x = random_case(type_name, 37, n_per_row, max(COLUMNS), seed=7)
    for route in routes_here(type_name):
        alone = np.stack([cpu_matmul(w, type_name, n_per_row, x[c:c + 1], route=route)[0][0] for c in range(x.shape[0])])
        ref = x.astype(np.float64) @ wd.T
        scale = np.abs(x.astype(np.float64)) @ np.abs(wd).T
        assert np.all(np.abs(alone - ref) <= 2e-2 * scale), f"{type_name} {route}"  # the activation's rounding at most
        for n in COLUMNS:
            first = n % 5  # batches start at different columns
            y, _ = cpu_matmul(w, type_name, n_per_row, x[first:first + n], route=route, threads=2)
            assert np.array_equal(y.view(np.uint32), alone[first:first + n].view(np.uint32)), f"{type_name} {route} n={n}"


@pytest.mark.skipif(cpu_isa() not in BLOCKS_ISAS, reason="the blocks kernel needs AVX2")
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_packed_weights_give_the_plain_layout_bits(type_name: str):
    """A model's block weights are packed at load (groups of 16 rows in the kernel's layout, a last
    group padded): every row count, every batch, the bits of the plain rows."""
    for n_rows, n_per_row in ((1, 32), (17, 96), (31, 608), (48, 1536)):
        w, _, x = random_case(type_name, n_rows, n_per_row, 33, seed=n_rows * 7 + n_per_row)
        for n_cols in (1, 2, 5, 6, 9, 16, 17, 33):
            packed, _ = cpu_matmul(w, type_name, n_per_row, x[:n_cols], route="blocks", threads=2)
            plain, _ = cpu_matmul(w, type_name, n_per_row, x[:n_cols], route="blocks_plain", threads=2)
            assert np.array_equal(packed.view(np.uint32), plain.view(np.uint32)), f"{type_name} {n_rows}x{n_per_row} n={n_cols}"


def test_the_runtime_picks_blocks_where_the_cpu_has_avx2():
    w, _, x = random_case("q8_0", 16, 64, 3, seed=1)
    _, taken = cpu_matmul(w, "q8_0", 64, x)
    assert taken == ("blocks" if cpu_isa() in BLOCKS_ISAS else taken)
    assert cpu_isa() in ("scalar", "avx2") + BLOCKS_ISAS


def test_bad_routes_are_refused():
    w, _, x = random_case("f16", 16, 64, 2, seed=1)
    with pytest.raises(InvalidArgumentError, match="unknown matmul route"):
        cpu_matmul(w, "f16", 64, x, route="fastest")
    with pytest.raises(UnsupportedError, match="route blocks cannot run f16"):
        cpu_matmul(w, "f16", 64, x, route="blocks")
    with pytest.raises(InvalidArgumentError, match="bytes"):
        cpu_matmul(w.reshape(-1)[:-3], "f16", 64, x)  # bytes that are not whole rows


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


AMX_BF16 = cpu_isa() == "amx_int8" and "amx_bf16" in cpu_flags()

BF16_AUTO = """
import json, sys
import numpy as np
from dspark_ggml.quant import cpu_isa, cpu_matmul
case = np.load(sys.argv[1])
ys, routes = [], []
for n in (1, 9, 64):
    y, route = cpu_matmul(case["w"], "bf16", int(case["k"]), case["x"][:n], threads=2)
    ys.append(y)
    routes.append(route)
np.save(sys.argv[2], ys[-1])
print(json.dumps({"isa": cpu_isa(), "routes": routes}))
"""


@pytest.mark.skipif(not AMX_BF16, reason="needs AMX-BF16 tiles granted by the OS (Intel Xeons from Sapphire Rapids)")
def test_bf16_weights_run_one_tile_program_for_every_batch(tmp_path):
    """With AMX-BF16, bf16 weights take the tile program for every batch, prefills included (the
    `own` route at 64 columns, where the AVX512-BF16 plan hands them to ggml's sgemm), each column
    the bits it gets alone, and right to float rounding: each product of bf16 operands is exact in
    f32, so the float64 product of the bf16-rounded columns is the reference. Capped at VNNI
    (DSPARK_CPU_ISA=avx512_vnni), the other kernels run and agree to rounding."""
    for n_rows, n_per_row in ((1, 32), (15, 96), (37, 608), (70, 1536)):
        w, wd, x = random_case("bf16", n_rows, n_per_row, 64, seed=n_rows + n_per_row)
        xb = dequantize(quantize(x, "bf16"), "bf16", x.shape).astype(np.float64)
        ref, scale = xb @ wd.T, np.abs(xb) @ np.abs(wd).T
        alone = np.stack([cpu_matmul(w, "bf16", n_per_row, x[c:c + 1])[0][0] for c in range(x.shape[0])])
        assert np.all(np.abs(alone - ref) <= 1e-6 * scale), f"{n_rows}x{n_per_row}"
        for n in (2, 9, 16, 17, 33, 64):
            y, taken = cpu_matmul(w, "bf16", n_per_row, x[:n], threads=2)
            assert taken == "own", f"{n_rows}x{n_per_row} n={n}: {taken}"
            assert np.array_equal(y.view(np.uint32), alone[:n].view(np.uint32)), f"{n_rows}x{n_per_row} n={n}"
        case = tmp_path / "case.npz"
        np.savez(case, w=w, x=x, k=n_per_row)
        env = dict(os.environ, DSPARK_CPU_ISA="avx512_vnni")
        res = subprocess.run([sys.executable, "-c", BF16_AUTO, str(case), str(tmp_path / "y.npy")], env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["isa"] == "avx512_vnni" and out["routes"][-1] == "ggml", out  # a prefill: ggml's sgemm
        assert np.all(np.abs(np.load(tmp_path / "y.npy") - ref) <= 1e-5 * scale)


LESSER_ISA = """
import hashlib, json, sys
import numpy as np
from dspark_ggml.quant import cpu_isa, cpu_matmul, quantize
rng = np.random.default_rng(3)
out = {"isa": cpu_isa(), "routes": {}, "bits": {}, "invariant": True}
for t in ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]:
    w = quantize(rng.standard_normal((37, 608)).astype(np.float32), t)
    x = rng.standard_normal((17, 608)).astype(np.float32)
    y, route = cpu_matmul(w, t, 608, x, threads=2)
    out["routes"][t] = route
    out["bits"][t] = hashlib.sha256(y.tobytes()).hexdigest()
    for c in range(17):
        out["invariant"] &= bool(np.array_equal(cpu_matmul(w, t, 608, x[c:c + 1])[0][0], y[c]))
print(json.dumps(out))
"""


def run_with_isa(isa: str | None) -> dict:
    env = dict(os.environ)
    env.pop("DSPARK_CPU_ISA", None)
    if isa:
        env["DSPARK_CPU_ISA"] = isa
    res = subprocess.run([sys.executable, "-c", LESSER_ISA], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_scalar_takes_the_other_routes():
    out = run_with_isa("scalar")
    assert out["isa"] == "scalar"
    assert "blocks" not in out["routes"].values()
    assert out["invariant"]


@pytest.mark.skipif(cpu_isa() not in BLOCKS_ISAS, reason="the blocks kernel needs AVX2")
def test_the_avx2_build_gives_the_bits_of_the_best_one():
    """Forced to AVX2, the block types still take the blocks kernel (its AVX2 build), every column
    as alone, with the bits this CPU's own build gives (on an AVX-512 machine: the VNNI pass's)."""
    native, avx2 = run_with_isa(None), run_with_isa("avx2")
    assert avx2["isa"] == "avx2" and set(avx2["routes"].values()) == {"blocks"}, avx2
    assert native["routes"] == avx2["routes"] and avx2["invariant"] and native["invariant"]
    assert avx2["bits"] == native["bits"]


VNNI_ONLY = """
import json, sys
import numpy as np
from dspark_ggml.quant import cpu_isa, cpu_matmul
case = np.load(sys.argv[1])
y, route = cpu_matmul(case["w"], str(case["type"]), int(case["k"]), case["x"], route="blocks", threads=2)
np.save(sys.argv[2], y)
print(json.dumps({"isa": cpu_isa(), "route": route}))
"""


@pytest.mark.skipif(cpu_isa() != "amx_int8", reason="needs AMX tiles granted by the OS (Intel Xeons from Sapphire Rapids)")
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_amx_tiles_give_the_vnni_pass_bits(type_name: str, tmp_path):
    """The tile pass (12 columns and more) and the VNNI pass (DSPARK_CPU_ISA=avx512_vnni) compute the
    same integers and the same float chain: every column, every batch size, the same bits."""
    for n_rows, n_per_row in ((1, 32), (19, 96), (37, 608), (50, 1536)):
        w, wd, x = random_case(type_name, n_rows, n_per_row, 70, seed=n_rows + n_per_row)
        for n_cols in (9, 11, 12, 16, 17, 33, 70):  # one tile pass, two, several; the VNNI pass below 12
            y, taken = cpu_matmul(w, type_name, n_per_row, x[:n_cols], route="blocks", threads=2)
            case = tmp_path / "case.npz"
            np.savez(case, w=w, x=x[:n_cols], type=type_name, k=n_per_row)
            env = dict(os.environ, DSPARK_CPU_ISA="avx512_vnni")
            res = subprocess.run([sys.executable, "-c", VNNI_ONLY, str(case), str(tmp_path / "y.npy")], env=env,
                                 capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stderr
            assert json.loads(res.stdout.strip().splitlines()[-1]) == {"isa": "avx512_vnni", "route": "blocks"}
            vnni = np.load(tmp_path / "y.npy")
            assert np.array_equal(y.view(np.uint32), vnni.view(np.uint32)), f"{type_name} {n_rows}x{n_per_row} n={n_cols}"
            ref = q8_0_columns(x[:n_cols]) @ wd.T  # and both right
            scale = np.abs(q8_0_columns(x[:n_cols])) @ np.abs(wd).T
            assert np.all(np.abs(y - ref) <= 1e-6 * scale + 1e-30)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="the OS reports no CPU flags here (not Linux)")
def test_cpu_flags_hold_what_the_kernels_use():
    """system.cpu_flags (the OS's report, which the recipe reads for bf16 training) against the
    runtime's own CPUID dispatch: the ISA our kernels picked is among the flags."""
    from dspark_ggml.system import cpu_flags

    flags = cpu_flags()
    needs = {"scalar": set(), "avx2": {"avx2"}, "avx512_vnni": {"avx512f", "avx512_vnni"},
             "amx_int8": {"avx512_vnni", "amx_int8"}}[cpu_isa()]
    assert needs <= flags, f"the kernels use {cpu_isa()}, the OS reports {sorted(flags & needs)}"
    assert all(isinstance(f, str) and f and " " not in f for f in flags)
