#!/usr/bin/env bash
# The CPU test suites again under sanitizers, each in its own build directory.
#   asan: ASan + UBSan (${TIGON_ASAN_BUILD_DIR:-build-asan}). TIGON_ASAN_SCOPE picks what runs:
#         server (default): the server unit tests (validation, auth, the gRPC service against a fake
#           engine) - no LibTorch to compile, so it fits in CI's time;
#         all: also the models and engine gtest suites and the pytest integration tests against the
#           sanitized tigon-server. About 40 LibTorch translation units built with ASan: too slow
#           for CI on two cores next to the normal build; run it by hand.
#         The untrusted-input parsers (safetensors, config.json, request validation) also run under
#         ASan + UBSan in every CI run through the fuzz targets (fuzz/run.sh).
#   tsan: TSan (${TIGON_TSAN_BUILD_DIR:-build-tsan}) over the server unit tests, whose concurrency (the
#         gRPC service, per-session serialisation, the idle reaper, draining) runs against a fake
#         engine. LibTorch is not TSan-instrumented, so the engine is left out. gRPC is not
#         instrumented either: cmake/sanitizers/tsan.supp says what is suppressed and why. Under TSan
#         the tests' timing windows (100-150 ms sleeps) do not hold, so this run fails on
#         ThreadSanitizer reports only; the assertions themselves are checked by the normal run.
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
      scope=${TIGON_ASAN_SCOPE:-server}
      echo "== ASan + UBSan build ($dir, scope $scope)"
      configure "$dir" address,undefined
      export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
      export LSAN_OPTIONS="suppressions=$PWD/cmake/sanitizers/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
      if [[ $scope == all ]]; then
        ninja -C "$dir" -j "$JOBS" tigon_model_tests tigon_engine_tests tigon_server_tests tigon-server
        echo "== models, engine and server gtest suites under ASan + UBSan"
        # The kernel suite is not built; its placeholder test is the one excluded.
        ctest --test-dir "$dir" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 1800 \
          -E '^tigon_kernel_tests_NOT_BUILT$'
        echo "== integration tests under ASan + UBSan"
        TIGON_BUILD_DIR="$PWD/$dir" /usr/bin/python3 -m pytest -q tests/integration
      else
        ninja -C "$dir" -j "$JOBS" tigon_server_tests
        echo "== server unit tests under ASan + UBSan"
        "$dir/tests/server/tigon_server_tests" --gtest_brief=1
      fi
      unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
      ;;
    tsan)
      dir=${TIGON_TSAN_BUILD_DIR:-build-tsan}
      echo "== TSan build ($dir): server unit tests"
      configure "$dir" thread
      ninja -C "$dir" -j "$JOBS" tigon_server_tests
      echo "== server unit tests under TSan (failing on ThreadSanitizer reports)"
      log="$dir/tsan-server-tests.log"
      # ignore_noninstrumented_modules: accesses that uninstrumented libraries (gRPC, abseil,
      # protobuf) make through libc are not recorded, since their synchronisation is not either.
      # One process per test (ctest): a test that aborts on a missed timing window takes no other down.
      TSAN_OPTIONS="second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/cmake/sanitizers/tsan.supp" \
        ctest --test-dir "$dir" --output-on-failure -j "${TIGON_TEST_JOBS:-2}" --timeout 600 -E '_NOT_BUILT$' \
          > "$log" 2>&1 || true
      reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
      summary=$(grep -E "tests passed|tests failed" "$log" || true)
      echo "   ctest: ${summary:-no summary}; ThreadSanitizer reports: $reports" \
           "(tests failing without a report missed a timing window under TSan's slowdown; not counted)"
      if ((reports > 0)) || [[ -z $summary ]]; then
        grep -B3 -A40 "WARNING: ThreadSanitizer" "$log" | head -200 || tail -50 "$log"
        echo "!! TSan: data races in the server tests (or no test ran); full log: $log"
        exit 1
      fi
      ;;
    *) echo "unknown mode '$mode' (asan, tsan)" >&2; exit 2 ;;
  esac
done
echo "== sanitizer runs passed: ${MODES[*]}"
