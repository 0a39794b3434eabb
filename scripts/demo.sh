#!/usr/bin/env bash
# Sets up the machine, builds Tigon and trains a small byte-level model, showing the loss fall.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD_DIR=${TIGON_BUILD_DIR:-build}
"$BUILD_DIR/engine/tigon-train" --steps 150 --batch 8 --seq 64 --hidden 64 --layers 2 --lr 1e-2 "$@"
