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

# ggml-cuda needs cuBLAS (header and library) next to nvcc; a toolkit without it fails at CMake's
# generate step with "CUDA::cublas ... target was not found", so say so plainly first.
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
if ! find "$cuda_root"/ /usr/include -maxdepth 4 -name cublas_v2.h 2>/dev/null | grep -q .; then
    echo "cuda_check: no cuBLAS next to $(command -v nvcc) (cublas_v2.h not found); ggml-cuda needs it:" \
         "install the toolkit's cuBLAS (e.g. apt-get install libcublas-dev-13-0, or the full CUDA toolkit)" >&2
    exit 2
fi

# The toolkit's own libraries (cuBLAS, cudart) are loaded at run time: find them even where the
# toolkit is not in the loader's configuration.
export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/targets/$(uname -m)-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Without a GPU driver there is no libcuda.so to link ggml's virtual-memory pool against: a compile
# check then builds without it (GGML_CUDA_NO_VMM, a supported ggml option).
extra=()
if [ "${BUILD_ONLY:-0}" = 1 ] && ! ldconfig -p | grep -q "libcuda.so" && \
   ! find "$cuda_root"/ -maxdepth 4 -name "libcuda.so" 2>/dev/null | grep -q .; then
    echo "cuda_check: no libcuda.so (no driver): compile check with GGML_CUDA_NO_VMM=ON" >&2
    extra+=(-Ccmake.define.GGML_CUDA_NO_VMM=ON)
fi

ggml_tree=$(python3 third_party/llama_cpp_sdist.py extract ggml)
python3 -m venv .venv-cuda
.venv-cuda/bin/pip install -q ".[test]" -Cbuild-dir=build/cuda-"$ARCH" \
    -Ccmake.define.DSPARK_GGML_SOURCE_DIR="$ggml_tree" -Ccmake.define.GGML_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH" ${extra[@]+"${extra[@]}"}
.venv-cuda/bin/dspark-ggml info --system
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0

.venv-cuda/bin/dspark-ggml info --system | grep -q "CUDA0" || { echo "no CUDA device" >&2; exit 1; }
.venv-cuda/bin/python -m pytest -q -m device tests/test_devices.py
mkdir -p bench/results
for b in bench_target bench_draft; do
    .venv-cuda/bin/python bench/$b.py | tee bench/results/cuda-$b.txt
done
.venv-cuda/bin/dspark-ggml bench -t 2 | tee bench/results/cuda-bench.txt
