#!/usr/bin/env bash
# For a machine with an NVIDIA GPU: build a CUDA-enabled copy of dspark-ggml for one architecture
# (in its own venv and build directory), then run the device tests against the CPU and the speed
# benchmarks on the GPU (models go to the first GPU by default).
# Usage: tools/cuda_check.sh [ARCH]   ARCH: a CMAKE_CUDA_ARCHITECTURES value, default "native"
#        (the GPU of this machine; e.g. 90 for H100/H200, 89 for L4/4090, 80 for A100).
# BUILD_ONLY=1 stops after the build (a compile check on a machine without a GPU: pass an ARCH).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-native}
export PATH=/usr/local/cuda/bin:$PATH

ggml_tree=$(python3 third_party/llama_cpp_sdist.py extract ggml)
python3 -m venv .venv-cuda
.venv-cuda/bin/pip install -q ".[test]" -Cbuild-dir=build/cuda-"$ARCH" \
    -Ccmake.define.DSPARK_GGML_SOURCE_DIR="$ggml_tree" -Ccmake.define.GGML_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH"
.venv-cuda/bin/dspark-ggml info --system
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

.venv-cuda/bin/dspark-ggml info --system | grep -q "CUDA0" || { echo "no CUDA device" >&2; exit 1; }
.venv-cuda/bin/python -m pytest -q -m device tests/test_devices.py
mkdir -p bench/results
for b in bench_target bench_draft bench_spec; do
    .venv-cuda/bin/python bench/$b.py | tee bench/results/cuda-$b.txt
done
