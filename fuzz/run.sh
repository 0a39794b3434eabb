#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into ${TIGON_FUZZ_BUILD_DIR:-build-fz} and fuzzes
# each for a bounded time, starting from its committed corpus in fuzz/corpus/<target>/.
#
#   fuzz/run.sh [SECONDS]          every target, SECONDS each (default 60); exit 1 on any crash
#   fuzz/run.sh SECONDS TARGET...  only those targets (fuzz_safetensors, fuzz_config, fuzz_request,
#                                  fuzz_checkpoint_path, fuzz_server_files)
#   TIGON_FUZZ_MERGE=1 fuzz/run.sh adds the new inputs that cover more code to fuzz/corpus/ (commit them
#                                  when the corpus stays small; it must stay under 1 MB in all)
#
# A crash, an uncaught exception, a sanitizer report, an allocation over 1 GiB or an input that takes
# over 10 s fails the run; the input is saved under $BUILD_DIR/fuzz-artifacts/<target>/ and printed in
# base64. To keep it: copy it into fuzz/corpus/<target>/ under a descriptive name and add a gtest case
# (tests/models/test_fuzz_regressions.cpp, tests/server/test_fuzz_regressions.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_safetensors fuzz_config fuzz_request fuzz_checkpoint_path fuzz_server_files)
BUILD_DIR=${TIGON_FUZZ_BUILD_DIR:-build-fz}
JOBS=${TIGON_JOBS:-$(nproc)}

if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTIGON_FUZZ=ON -DTIGON_SANITIZE=address,undefined -DTIGON_BUILD_TESTS=OFF -DTIGON_CUDA=OFF
fi
ninja -C "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for target in "${TARGETS[@]}"; do
  corpus="fuzz/corpus/$target"
  artifacts="$BUILD_DIR/fuzz-artifacts/$target"
  scratch="$BUILD_DIR/fuzz-scratch/$target"  # new inputs land here, not in the committed corpus
  rm -rf "$scratch"
  mkdir -p "$artifacts" "$scratch"
  # A fixed seed: the same run on every CI machine (new crashes are found by longer runs, not by luck).
  flags=(-seed="${TIGON_FUZZ_SEED:-1}" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1
         -artifact_prefix="$artifacts/")
  echo "== $target: the committed corpus ($(ls "$corpus" | wc -l) inputs), then ${SECONDS_PER_TARGET} s of fuzzing"
  status=0
  "$BUILD_DIR/fuzz/$target" "${flags[@]}" -runs=0 "$corpus" > "$BUILD_DIR/fuzz-$target.log" 2>&1 &&
    "$BUILD_DIR/fuzz/$target" "${flags[@]}" -max_total_time="$SECONDS_PER_TARGET" "$scratch" "$corpus" \
      >> "$BUILD_DIR/fuzz-$target.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|Done [0-9]+ runs)" "$BUILD_DIR/fuzz-$target.log" | tail -2 || true
  if ((status != 0)); then
    echo "!! $target failed (exit $status); the end of its log ($BUILD_DIR/fuzz-$target.log):"
    grep -v -E "^(#[0-9]+|INFO:|	NEW_FUNC)" "$BUILD_DIR/fuzz-$target.log" | tail -40
    for input in "$artifacts"/*; do
      [[ -f "$input" ]] && echo "input $input (base64): $(base64 -w0 "$input" | head -c 2000)"
    done
    failed+=("$target")
  elif [[ ${TIGON_FUZZ_MERGE:-0} == 1 ]]; then
    "$BUILD_DIR/fuzz/$target" -merge=1 "$corpus" "$scratch" > "$BUILD_DIR/fuzz-$target-merge.log" 2>&1
    echo "   merged: $(ls "$corpus" | wc -l) inputs, $(du -sh "$corpus" | cut -f1)"
  fi
done
if ((${#failed[@]})); then
  echo "== fuzzing found problems in: ${failed[*]}"
  exit 1
fi
echo "== fuzzing: no crash in ${#TARGETS[@]} targets (${SECONDS_PER_TARGET} s each)"
