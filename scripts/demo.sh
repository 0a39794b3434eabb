#!/usr/bin/env bash
# Sets up the machine, builds Tigon, starts tigon-server on a free loopback port and fine-tunes a small
# byte-level model through the Python client, showing the loss fall. On a machine with a GPU the same run
# is repeated with reference kernels and the two are compared. Extra arguments go to tigon.finetune.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Only what the demo runs: the server and the engine and kernel libraries it links (the test suites take
# longer to build than the rest; scripts/test.sh builds them).
TIGON_BUILD_TARGETS="tigon-server" bash scripts/build.sh
BUILD_DIR=${TIGON_BUILD_DIR:-build}
bash scripts/finetune.sh --server-bin "$BUILD_DIR/server/tigon-server" --kernels auto --steps 150 "$@"
