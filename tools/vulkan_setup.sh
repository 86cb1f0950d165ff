#!/usr/bin/env bash
# Prepares a machine for a Vulkan build of dspark-ggml and for running it on a software GPU:
#   - Mesa's lavapipe (a Vulkan driver on the CPU), glslc (ggml compiles its shaders with it) and
#     the Vulkan loader, from the distribution;
#   - Vulkan and SPIR-V headers new enough for ggml 0.25.3 (Debian 12's 1.3.239 lack
#     vk::LayerSettingEXT): Debian 13's libvulkan-dev and spirv-headers, unpacked into a folder
#     without installing them.
# Prints the pip options that point CMake at those headers (nothing when the system's are new
# enough), so a build reads:  pip install . -Ccmake.define.GGML_VULKAN=ON $(tools/vulkan_setup.sh)
# Usage: tools/vulkan_setup.sh [DEST]   (DEST defaults to ~/.cache/dspark-ggml/vulkan-headers)
set -euo pipefail
DEST=${1:-${DSPARK_GGML_CACHE:-$HOME/.cache/dspark-ggml}/vulkan-headers}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

# Headers of at least this version compile ggml-vulkan.cpp.
have_new_headers() {  # $1: include dir
    local h="$1/vulkan/vulkan_core.h"
    [ -f "$h" ] || return 1
    local v; v=$(awk '/#define VK_HEADER_VERSION /{print $3; exit}' "$h")
    [ "${v:-0}" -ge 275 ]
}

install_driver() {
    command -v glslc >/dev/null && [ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] \
        && [ -f /usr/include/vulkan/vulkan.h ] && return 0
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers glslc libvulkan-dev >/dev/null
    # Debian 13+ has new enough SPIR-V headers; Debian 12's are replaced by the download below
    $SUDO apt-get install -y -qq spirv-headers >/dev/null 2>&1 || true
}

# Downloads Debian 13's libvulkan-dev and spirv-headers with apt from the mirror this machine already uses, through a
# private sources list and lists folder, so the system's apt configuration is left unchanged.
fetch_trixie_headers() {
    local t; t=$(mktemp -d)
    local uri
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    uri=${uri:-http://deb.debian.org/debian}
    echo "deb $uri trixie main" > "$t/list"
    mkdir -p "$t/lists/partial"
    local a=(-o Dir::Etc::sourcelist="$t/list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$t/lists")
    apt-get "${a[@]}" -qq update 2>&1 | grep -v unsandboxed >&2 || true
    (cd "$t" && apt-get "${a[@]}" -qq download libvulkan-dev spirv-headers 2>&1 | grep -v unsandboxed >&2 || true)
    rm -rf "$DEST.tmp" && mkdir -p "$DEST.tmp"
    dpkg -x "$t"/libvulkan-dev_*.deb "$DEST.tmp"
    dpkg -x "$t"/spirv-headers_*.deb "$DEST.tmp"
    rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
    rm -rf "$t"
}

install_driver >&2
if have_new_headers /usr/include && [ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ]; then
    exit 0                                 # Debian 13 (or newer): the system's headers do
fi
p="$DEST/usr"
have_new_headers "$p/include" && [ -f "$p/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" ] || fetch_trixie_headers
have_new_headers "$p/include" || { echo "no usable Vulkan headers in $DEST" >&2; exit 1; }
echo "-Ccmake.define.Vulkan_INCLUDE_DIR=$p/include -Ccmake.define.SPIRV-Headers_DIR=$p/share/cmake/SPIRV-Headers"
