#!/usr/bin/env bash
# On the GPU machine: builds and runs the kernel benchmarks; JSON and logs go to ${OUT:-out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${OUT:-out}; mkdir -p "$LOGS"
bash deploy/device/build.sh > "$LOGS/build.log" 2>&1 || { tail -60 "$LOGS/build.log"; exit 1; }
source deploy/device/env.sh
export TIGON_KERNELS_LIB=$PWD/$TIGON_BUILD_DIR/kernels/libtigon_kernels.so
status=0
for script in bench/bench_*.py; do
  name=$(basename "$script" .py)
  echo "== $name"
  $TIGON_PYTHON "$script" --out "$LOGS/$name.json" 2>&1 | tee "$LOGS/$name.log" | tail -20 || status=1
done
exit $status
