#!/usr/bin/env bash
# Builds ggml's own test-backend-ops (tests/test-backend-ops.cpp of the pinned llama.cpp sdist)
# against an existing ggml build of this package and runs the given ops on a device: the check
# of whether a wrong result or a crash is the backend's, not our graph's.
# Usage: tools/vk_backend_ops.sh BUILD_DIR [DEVICE [OP,OP,...]]
#   e.g. GGML_VK_VISIBLE_DEVICES=0 tools/vk_backend_ops.sh build/vk Vulkan0 FLASH_ATTN_EXT,SET,CONCAT
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "$1"); DEV=${2:-Vulkan0}; OPS=${3:-FLASH_ATTN_EXT,SET,CONCAT,ARGMAX,GET_ROWS,SET_ROWS}
ggml_tree=$(python3 third_party/llama_cpp_sdist.py extract ggml)
out="$BUILD/test-backend-ops"
if [ ! -x "$out" ]; then
    src=$(python3 third_party/llama_cpp_sdist.py extract tests --dest "$BUILD/llama-tests")
    g++ -O1 -std=c++17 -fopenmp "$src/test-backend-ops.cpp" -I"$ggml_tree/include" -L"$BUILD/ggml/src" \
        -lggml -lggml-base -Wl,-rpath,"$BUILD/ggml/src" -o "$out"
fi
"$out" test -b "$DEV" -o "$OPS"
