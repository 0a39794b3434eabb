#!/usr/bin/env bash
# The CPU test suites again under sanitizers, each in its own build directory:
#   asan: ASan + UBSan (${TIGON_ASAN_BUILD_DIR:-build-asan}): the gtest suites of the models, engine and
#         server layers, then the pytest integration tests against the sanitized tigon-server.
#   tsan: TSan (${TIGON_TSAN_BUILD_DIR:-build-tsan}): the server unit tests, whose concurrency (the
#         gRPC service, sessions, the idle reaper) runs against a fake engine. LibTorch is not
#         TSan-instrumented, so the engine is left out: TSan there would report torch's own thread
#         pool handoffs, not ours.
# The kernel suite is left out of asan: its CPU kernels are exercised through the model and engine
# suites, and its ten LibTorch test units would add about as much build time as everything else here.
# Usage: scripts/test_sanitizers.sh [asan|tsan]...   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${TIGON_JOBS:-$(nproc)}
MODES=("$@")
((${#MODES[@]})) || MODES=(asan tsan)

configure() {  # dir sanitizers
  if [[ ! -f "$1/build.ninja" ]]; then
    cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIGON_SANITIZE="$2" -DTIGON_CUDA=OFF
  fi
}

for mode in "${MODES[@]}"; do
  case "$mode" in
    asan)
      dir=${TIGON_ASAN_BUILD_DIR:-build-asan}
      echo "== ASan + UBSan build ($dir)"
      configure "$dir" address,undefined
      ninja -C "$dir" -j "$JOBS" tigon_model_tests tigon_engine_tests tigon_server_tests tigon-server
      # LibTorch keeps caches for the life of the process; lsan.supp lists them (with why). A report
      # that is not suppressed fails the test that made it.
      export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
      export LSAN_OPTIONS="suppressions=$PWD/cmake/sanitizers/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
      echo "== gtest suites under ASan + UBSan"
      # Every discovered test of the three suites; the kernel suite was not built (its placeholder
      # test is the one excluded).
      ctest --test-dir "$dir" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 1800 \
        -E '^tigon_kernel_tests_NOT_BUILT$'
      echo "== integration tests under ASan + UBSan"
      TIGON_BUILD_DIR="$PWD/$dir" /usr/bin/python3 -m pytest -q tests/integration
      unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
      ;;
    tsan)
      dir=${TIGON_TSAN_BUILD_DIR:-build-tsan}
      echo "== TSan build ($dir): server unit tests"
      configure "$dir" thread
      ninja -C "$dir" -j "$JOBS" tigon_server_tests
      echo "== server unit tests under TSan"
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/cmake/sanitizers/tsan.supp" \
        ctest --test-dir "$dir" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 1800
      ;;
    *) echo "unknown mode '$mode' (asan, tsan)" >&2; exit 2 ;;
  esac
done
echo "== sanitizer runs passed: ${MODES[*]}"
