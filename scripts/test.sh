#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds everything, and runs every test suite that needs no GPU:
# the gtest suites (kernels, models, engine, server) and the pytest integration tests against the real
# server binary, then the gtest suites again under ASan + UBSan and the server's under TSan
# (scripts/test_sanitizers.sh says what it leaves out) and a bounded fuzzing run (fuzz/run.sh). The GPU
# suite runs on a GPU machine: deploy/device/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TIGON_BUILD_TARGETS= bash scripts/build.sh  # everything: the test suites too
BUILD_DIR=${TIGON_BUILD_DIR:-build}
echo "== gtest suites"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 1800
if [[ -d tests/integration ]] && compgen -G "tests/integration/test_*.py" > /dev/null; then
  echo "== integration tests (pytest, live server)"
  TIGON_BUILD_DIR="$PWD/$BUILD_DIR" /usr/bin/python3 -m pytest -q tests/integration
fi
# Sanitizers and fuzzing (issue 8): TIGON_SANITIZERS=0 / TIGON_FUZZ_SECONDS=0 skip them locally.
if [[ ${TIGON_SANITIZERS:-1} != 0 ]]; then
  bash scripts/test_sanitizers.sh
fi
if [[ ${TIGON_FUZZ_SECONDS:-60} != 0 ]]; then
  echo "== fuzzing (fuzz/run.sh, ${TIGON_FUZZ_SECONDS:-60} s per target)"
  bash fuzz/run.sh "${TIGON_FUZZ_SECONDS:-60}"
fi
echo "== all tests passed"
