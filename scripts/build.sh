#!/usr/bin/env bash
# Configures and builds Tigon into ${TIGON_BUILD_DIR:-build} (CPU LibTorch here; see deploy/device for
# the GPU machine). Extra arguments go to cmake's configure step. TIGON_BUILD_TARGETS="tigon-server ..."
# builds only those targets and what they link (the demo's); unset, everything, the test suites included.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${TIGON_BUILD_DIR:-build}
JOBS=${TIGON_JOBS:-$(nproc)}
read -r -a TARGETS <<< "${TIGON_BUILD_TARGETS:-}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
ninja -C "$BUILD_DIR" -j "$JOBS" ${TARGETS[@]+"${TARGETS[@]}"}
