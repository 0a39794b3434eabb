#!/usr/bin/env bash
# Run on a Debian 12 machine with apt: downloads the .deb packages the GPU machine lacks (gRPC, protobuf,
# spdlog, fmt, nlohmann-json, prometheus-cpp with civetweb, gtest) into .deps/debs, to be carried to a GPU
# machine that has no package registry. See deploy/device/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 libprotobuf-dev libprotobuf32 \
  libprotobuf-lite32 libprotoc32 protobuf-compiler protobuf-compiler-grpc libabsl-dev libabsl20220623 \
  libc-ares2 libc-ares-dev libre2-9 libre2-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libssl-dev \
  libssl3 zlib1g-dev nlohmann-json3-dev libbrotli-dev libbrotli1 libgtest-dev \
  libgmock-dev googletest \
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0 \
  libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true
ls | wc -l
# Liger-Kernel's Python sources, the peer the post-training benchmarks run beside Tigon
# (bench/objective_heads.py), from a checkout next to the repository when there is one: the GPU machine
# has torch and triton but no package registry. env.sh puts .deps/python on PYTHONPATH.
cd ../..
for liger in ../shared/anchors/liger-kernel "${TIGON_LIGER_SRC:-}"; do
  if [[ -n $liger && -d $liger/src/liger_kernel ]]; then
    mkdir -p .deps/python && rm -rf .deps/python/liger_kernel && cp -r "$liger/src/liger_kernel" .deps/python/
    echo "liger_kernel from $liger"
    break
  fi
done
