#!/usr/bin/env bash
# Every check of a CUDA build in one run, for a machine with an NVIDIA GPU, with or without a network:
# build dspark-ggml with CUDA (CUDA graphs on), run the device tests on the GPU against the CPU, then
# the speed benchmarks, which print tables (bench/results/cuda-*.txt). About 8 minutes on a 16-core
# host with an H200, the build (about 200 s) included.
#
#   tools/cuda_check.sh [--arch ARCH] [--wheels DIR] [--ggml-tree DIR|TAR] [--installed] [--quick]
#
# On a GPU machine lent through this workplace's device tool (no network): run
# ../shared/tools/cuda/prepare.sh here, then `bash .device/run.sh bash tools/cuda_check.sh --installed`
# there (run.sh builds the package with CUDA first).
#
#   --arch       CMAKE_CUDA_ARCHITECTURES (default: native, the GPU of this machine; 90 for H100/H200)
#   --wheels     offline: install the runtime dependencies from this folder of wheels (pip download
#                them elsewhere: numpy cffi pycparser gguf llguidance safetensors tokenizers jinja2
#                tqdm, and pytest); the build tools (scikit-build-core, cmake, ninja) must be installed
#   --ggml-tree  the pinned ggml tree (a folder, or a .tar.xz of it) instead of the cached sdist
#                (third_party/llama_cpp_sdist.py fetches that, which needs the network once)
#   --installed  skip the build: dspark_ggml with CUDA is importable already
#   --quick      the device tests only
# BUILD_ONLY=1 stops after the build (a compile check on a machine without a GPU: pass --arch).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=native WHEELS="" TREE="" INSTALLED=0 QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) ARCH=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --ggml-tree) TREE=$2; shift 2 ;;
        --installed) INSTALLED=1; shift ;;
        --quick) QUICK=1; shift ;;
        *) echo "cuda_check: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
OUTDIR=bench/results; mkdir -p "$OUTDIR"
PY=python3

if [ "$INSTALLED" = 0 ]; then
    export PATH=$(ls -d /usr/local/cuda*/bin 2>/dev/null | head -1):$PATH
    command -v nvcc >/dev/null || { echo "cuda_check: no nvcc on the PATH (install the CUDA toolkit)" >&2; exit 2; }
    cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
    # ggml-cuda needs cuBLAS (header and library) next to nvcc; say so plainly rather than at CMake's generate step
    if ! find "$cuda_root"/ /usr/include -maxdepth 4 -name cublas_v2.h 2>/dev/null | grep -q .; then
        echo "cuda_check: no cuBLAS next to $(command -v nvcc) (cublas_v2.h not found); ggml-cuda needs it:" \
             "install the toolkit's cuBLAS (e.g. apt-get install libcublas-dev-13-0)" >&2
        exit 2
    fi
    export LD_LIBRARY_PATH="$cuda_root/lib64:$cuda_root/targets/$(uname -m)-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if [ -z "$TREE" ]; then
        TREE=$(python3 third_party/llama_cpp_sdist.py extract ggml)
    elif [ -f "$TREE" ]; then
        mkdir -p build/ggml-tree && tar -xJf "$TREE" -C build/ggml-tree && TREE=$(ls -d "$PWD"/build/ggml-tree/*)
    fi
    extra=()
    # without a driver there is no libcuda.so to link ggml's virtual-memory pool against
    if [ "${BUILD_ONLY:-0}" = 1 ] && ! ldconfig -p | grep -q "libcuda.so"; then
        extra+=(-Ccmake.define.GGML_CUDA_NO_VMM=ON)
    fi
    # the system's packages stay visible (an offline machine's torch, pytest, ...)
    python3 -m venv --system-site-packages .venv-cuda
    PY=$PWD/.venv-cuda/bin/python
    if [ -n "$WHEELS" ]; then
        $PY -m pip install -q --no-index --find-links "$WHEELS" numpy cffi gguf llguidance safetensors tokenizers jinja2 tqdm pytest
    else
        $PY -m pip install -q numpy cffi "gguf>=0.17" "llguidance>=1.9.1,<2" safetensors tokenizers jinja2 tqdm pytest \
            scikit-build-core cmake ninja
    fi
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PY -m pip install --no-build-isolation --no-deps --no-index . \
        -Cbuild-dir=build/cuda-"$ARCH" -Ccmake.define.DSPARK_GGML_SOURCE_DIR="$TREE" -Ccmake.define.GGML_CUDA=ON \
        -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH" ${extra[@]+"${extra[@]}"} > "$OUTDIR/cuda-build.log" 2>&1 \
        || { tail -30 "$OUTDIR/cuda-build.log"; exit 4; }
    [ "${BUILD_ONLY:-0}" = 1 ] && exit 0
fi

$PY -c "import dspark_ggml.system as s; print(s.system_info())"
$PY -c "import sys, dspark_ggml.system as s; sys.exit(0 if any(d.type != 'cpu' for d in s.devices()) else 1)" \
    || { echo "cuda_check: dspark_ggml sees no GPU" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# Device tests, each file in workers of its own: a test that aborts inside ggml takes one worker, not the run.
opts=()
$PY -c "import xdist" 2>/dev/null && opts+=(-n 4)
$PY -c "import pytest_timeout" 2>/dev/null && opts+=(--timeout 300)
set +e
$PY -m pytest -q -m device tests/test_devices.py ${opts[@]+"${opts[@]}"} -p no:cacheprovider 2>&1 | tee "$OUTDIR/cuda-tests.txt"
tests_rc=${PIPESTATUS[0]}
# where a row differs from its decode step: which part of the graphs (attention or matmuls) and which types
[ "$tests_rc" != 0 ] && $PY tools/device_invariance.py --types f16 q8_0 q4_K 2>&1 | tee "$OUTDIR/cuda-invariance.txt"
set -e
if [ "$QUICK" = 0 ]; then
    # Benchmarks (tables): the step costs of the default route next to ggml's kernels, a verify row
    # against its decode step at real widths (Qwen3-0.6B's shape), then the planted pair.
    (cd bench && $PY bench_cuda.py --runs 2) 2>&1 | tee "$OUTDIR/cuda-bench_cuda.txt"
    $PY tools/device_invariance.py --model bench/results/qwen3-0.6b-random-q8_0.gguf 2>&1 | tee "$OUTDIR/cuda-invariance-real.txt"
    (cd bench && $PY bench_planted.py greedy --no-llama-cpp --n-prompts 3 --max-tokens 64) 2>&1 | tee "$OUTDIR/cuda-bench_planted.txt"
fi
# (the device tool's $OUT: what comes back from a lent GPU machine)
if [ -n "${OUT:-}" ]; then cp "$OUTDIR"/cuda-*.txt "$OUT"/ 2>/dev/null || true; fi
exit "$tests_rc"
