#!/usr/bin/env bash
# CI step: the core tests once more against a build with AddressSanitizer and UndefinedBehavior-
# Sanitizer (its own venv and build directory), the sanitizer runtimes preloaded into Python. A
# finding stops the test process, so it fails CI. Leaks are checked where the process is ours:
# the C example runs under LeakSanitizer inside tests/test_c_api.py (the normal suite).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-asan
.venv-asan/bin/pip install -q ".[test]" -Ccmake.define.DSPARK_SANITIZE=ON -Cbuild-dir=build/ci-asan

LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    .venv-asan/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_gguf_file.py tests/test_load_validation.py tests/test_target.py tests/test_draft.py \
    tests/test_engine.py tests/test_engine_limits.py tests/test_llm.py tests/test_cli.py tests/test_c_api.py \
    tests/test_check.py tests/test_fuzz_requests.py tests/test_fuzz_gguf.py \
    tests/test_engine_adjust.py tests/test_engine_constraint.py tests/test_cpu_kernels.py
