#!/usr/bin/env bash
# Installs every Debian 12 package Tigon's build, tests and demo need. Idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev                                   # LibTorch 1.13 (CPU) for the engine
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev
  prometheus-cpp-dev                             # the metrics registry and its HTTP exposer (civetweb)
  libgtest-dev libgmock-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-pytest python3-yaml
  prometheus                                     # promtool and a real Prometheus for the metrics tests
  clang libclang-rt-14-dev                       # libFuzzer and the sanitizer runtimes (fuzz/run.sh)
  openssl                                        # test certificates for the TLS tests
  slurmctld slurmd slurm-client                  # a one-node Slurm for the sbatch drain test
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
