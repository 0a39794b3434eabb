#!/usr/bin/env bash
# On the GPU machine: builds and runs the kernel benchmarks; JSON and logs go to ${OUT:-out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
source deploy/device/prelude.sh
status=0
for script in bench/bench_*.py; do
  name=$(basename "$script" .py)
  echo "== $name"
  $TIGON_PYTHON "$script" --out "$LOGS/$name.json" 2>&1 | tee "$LOGS/$name.log" | tail -20 || status=1
done
exit $status
