"""The public C API on its own: the header compiles as C and the C example, built against the
installed header and library, generates what the Python layer generates."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dspark_ggml import _lib
from dspark_ggml.context import Context
from dspark_ggml.draft import DraftContext, DraftModel
from dspark_ggml.engine import Engine
from dspark_ggml.model import Model
from dspark_ggml.sampling import SamplingParams
from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")


@needs_cc
def test_header_compiles_as_c99(tmp_path):
    src = tmp_path / "h.c"
    src.write_text('#include "dspark.h"\nint main(void) { struct dspark_spec_params p = dspark_spec_default_params(); return p.n_max; }\n')
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", str(src), "-I",
                    str(_lib.header_path().parent), "-o", str(tmp_path / "h.o")], check=True)


@needs_cc
def test_c_example_matches_the_python_engine(tmp_path):
    exe = tmp_path / "spec-generate"
    lib_dir = _lib.lib_dir()
    subprocess.run([CC, "-std=c99", "-O1", str(ROOT / "examples" / "spec-generate.c"), "-I", str(_lib.header_path().parent),
                    "-L", str(lib_dir), "-ldspark", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)], check=True)
    tcfg = TargetConfig(n_layer=3)
    write_target(tmp_path / "t.gguf", tcfg, seed=2)
    write_draft(tmp_path / "d.gguf", DraftConfig(block_size=4), tcfg, seed=3)
    prompt = [5, 9, 33, 100, 7]
    res = subprocess.run([str(exe), str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf"), "30", *map(str, prompt)],
                         check=True, capture_output=True, text=True)
    tokens = [int(t) for t in res.stdout.splitlines()[0].split()]
    t = Model(tmp_path / "t.gguf")
    eng = Engine(Context(t, n_ctx=512, n_threads=1), DraftContext(DraftModel(tmp_path / "d.gguf", t), n_ctx=512, n_threads=1))
    assert tokens == eng.generate(prompt, SamplingParams(max_tokens=30))
    assert "generated 30" in res.stdout
    bad = subprocess.run([str(exe), str(tmp_path / "missing.gguf"), "-", "5", "1"], capture_output=True, text=True)
    assert bad.returncode == 1 and "missing.gguf" in bad.stderr


@needs_cc
def test_c_example_is_leak_free_under_leaksanitizer(tmp_path):
    """The example built with AddressSanitizer (its LeakSanitizer sees every allocation of the
    process, the library's too), on the success path and on each error path."""
    exe = tmp_path / "spec-generate-asan"
    lib_dir = _lib.lib_dir()
    build = subprocess.run([CC, "-std=c99", "-O1", "-g", "-fsanitize=address", str(ROOT / "examples" / "spec-generate.c"),
                            "-I", str(_lib.header_path().parent), "-L", str(lib_dir), "-ldspark", f"-Wl,-rpath,{lib_dir}",
                            "-o", str(exe)], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"no AddressSanitizer runtime for {CC}: {build.stderr[-200:]}")
    tcfg = TargetConfig(n_layer=2)
    write_target(tmp_path / "t.gguf", tcfg, seed=2)
    write_draft(tmp_path / "d.gguf", DraftConfig(block_size=4), tcfg, seed=3)
    data = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:exitcode=23"}
    env.pop("LD_PRELOAD", None)  # the executable brings its own runtime
    for args, rc in [((tmp_path / "t.gguf", tmp_path / "d.gguf", 12, 5, 9, 33), 0), ((tmp_path / "missing.gguf", "-", 5, 1), 1),
                     ((tmp_path / "t.gguf", tmp_path / "cut.gguf", 5, 1), 1), ((tmp_path / "t.gguf", "-", 5, 99999), 1)]:
        res = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
        assert "LeakSanitizer" not in res.stderr, res.stderr[-3000:]
        assert res.returncode == rc, (args, res.returncode, res.stderr[-500:])
