#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds everything, and runs every test suite that needs no GPU:
# the gtest suites (kernels, models, engine, server) and the pytest integration tests against the real
# server binary. The GPU suite runs on a GPU machine: deploy/device/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD_DIR=${TIGON_BUILD_DIR:-build}
echo "== gtest suites"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 1800
if [[ -d tests/integration ]] && compgen -G "tests/integration/test_*.py" > /dev/null; then
  echo "== integration tests (pytest, live server)"
  TIGON_BUILD_DIR="$PWD/$BUILD_DIR" /usr/bin/python3 -m pytest -q tests/integration
fi
echo "== all tests passed"
