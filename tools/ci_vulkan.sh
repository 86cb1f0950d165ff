#!/usr/bin/env bash
# CI step: a second, Vulkan-enabled copy of the package (its own venv and build directory) on
# Mesa's lavapipe, and the device tests on Vulkan0. Fails when the device is missing rather than
# letting the tests skip. On 2 cores (AMD EPYC Zen 4): the build ~3.5 minutes, the tests ~21 with a
# cold shader cache (see the limit below).
set -euo pipefail
cd "$(dirname "$0")/.."

vk_opts=$(tools/vulkan_setup.sh)
ggml_tree=$(python3 third_party/llama_cpp_sdist.py extract ggml)

python3 -m venv .venv-vulkan
# shellcheck disable=SC2086
.venv-vulkan/bin/pip install -q ".[test]" -Cbuild-dir=build/ci-vulkan \
    -Ccmake.define.DSPARK_GGML_SOURCE_DIR="$ggml_tree" -Ccmake.define.GGML_VULKAN=ON $vk_opts

export GGML_VK_VISIBLE_DEVICES=0   # lavapipe is a CPU-type device, which ggml hides otherwise
# (printed from a variable: `tee /dev/stderr` would reopen, and so truncate, a log file CI writes to)
info=$(.venv-vulkan/bin/dspark-ggml info --system)
echo "$info"
grep -q "Vulkan0" <<<"$info" || { echo "no Vulkan0 device: the device tests would only skip" >&2; exit 1; }
# A hang in a driver is a failure too: dump the stacks and stop. With a cold Mesa shader cache
# (a fresh machine) lavapipe compiles each pipeline on first use, in LLVM: the iq4_nl row test
# alone takes ~8 minutes, 16 s warm; the limit leaves room for that on a loaded machine.
timeout 3300 .venv-vulkan/bin/python -m pytest -q -m device tests/test_devices.py -o faulthandler_timeout=900 \
    -p no:cacheprovider
