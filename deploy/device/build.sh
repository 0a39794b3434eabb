#!/usr/bin/env bash
# Builds the whole project on the GPU machine (LibTorch 2.11 + CUDA, sm_90), following deploy/device/README.md:
# gRPC/protobuf/spdlog come from carried Debian packages, found before Torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/device/env.sh
if [[ ! -f $TIGON_BUILD_DIR/build.ninja ]]; then
  cmake -S . -B "$TIGON_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$DEPS/usr" -DProtobuf_PROTOC_EXECUTABLE=$DEPS/usr/bin/protoc \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) \
    -DGTest_DIR=$DEPS/usr/lib/x86_64-linux-gnu/cmake/GTest "$@"
fi
# TIGON_TARGETS (space-separated) limits the build to those targets; default: everything.
ninja -C "$TIGON_BUILD_DIR" -j "$(nproc)" ${TIGON_TARGETS:-}
