#!/usr/bin/env bash
# On the GPU machine: builds, runs the GPU kernel suites (pytest through torch.ops.tigon) and the CPU
# gtest suites against LibTorch 2.11. Logs go to ${OUT:-out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
source deploy/device/prelude.sh
status=0
echo "== GPU kernel tests"
$TIGON_PYTHON -m pytest -q -x tests/gpu/kernels 2>&1 | tee "$LOGS/gpu_tests.log" | tail -25 || status=1
echo "== gtest suites (LibTorch $($TIGON_PYTHON -c 'import torch; print(torch.__version__)'))"
ctest --test-dir "$TIGON_BUILD_DIR" --output-on-failure -j 8 --timeout 900 > "$LOGS/ctest.log" 2>&1 || status=1
tail -15 "$LOGS/ctest.log"
exit $status
