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


# ---- library-wide behaviour ---------------------------------------------------------------------------

def test_core_logs_reach_python_logging_from_any_thread(tmp_path, caplog):
    """The core's log goes to logging.getLogger("dspark_ggml") at the matching level, from the
    calling thread and from others at once."""
    import logging
    import threading

    tcfg = TargetConfig(n_layer=2)
    write_target(tmp_path / "t.gguf", tcfg, seed=2)
    write_draft(tmp_path / "d.gguf", DraftConfig(block_size=4), tcfg, seed=3)
    target = Model(tmp_path / "t.gguf")
    draft = DraftModel(tmp_path / "d.gguf", target)

    def clamped_engine() -> None:  # n_max above the block size: a warning from the core
        Engine(Context(target, n_ctx=64, n_threads=1), DraftContext(draft, n_ctx=64, n_threads=1), n_max=99)

    with caplog.at_level(logging.DEBUG, logger="dspark_ggml"):
        clamped_engine()
        threads = [threading.Thread(target=clamped_engine) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    warnings = [r for r in caplog.records if r.name == "dspark_ggml" and "n_max 99 clamped" in r.getMessage()]
    assert len(warnings) == 5 and all(r.levelno == logging.WARNING for r in warnings)
    assert not warnings[0].getMessage().endswith("\n")


def test_errors_without_a_message_are_named_by_their_status():
    from dspark_ggml.errors import ContextFullError

    assert _lib.status_str(-6) == "context full" and _lib.status_str(-1) == "invalid argument"
    lib, ffi = _lib.lib(), _lib.ffi()
    assert lib.dspark_sampling_check(ffi.NULL) == -1  # a failure with a message: the message
    with pytest.raises(Exception, match="params is NULL"):
        _lib.check(-1)
    p = ffi.new("struct dspark_sampling_params *", lib.dspark_sampling_default_params())
    assert lib.dspark_sampling_check(p) == 0  # a success clears the last error: the status's name
    with pytest.raises(ContextFullError, match=r"context full \(status -6\)"):
        _lib.check(-6)


def test_the_library_leaves_the_process_environment_as_it_was(tmp_path):
    """Loading the backends (and, in a Vulkan build, creating its devices with ggml's switch for
    graph reordering set) leaves no variable behind, as seen by C's getenv in a fresh process."""
    code = (
        "import ctypes, os\n"
        "from dspark_ggml import _lib\n"
        "from dspark_ggml.system import devices\n"
        "devices()\n"
        "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
        "print(libc.getenv(b'GGML_VK_DISABLE_GRAPH_OPTIMIZE'), 'GGML_VK_DISABLE_GRAPH_OPTIMIZE' in os.environ)\n"
    )
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GGML_VK_DISABLE_GRAPH_OPTIMIZE", "DSPARK_VK_GRAPH_OPTIMIZE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["None", "False"]
