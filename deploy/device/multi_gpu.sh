#!/usr/bin/env bash
# On a machine with two or more GPUs (nvidia-h200-x2): data-parallel training over NCCL.
#   1. the engine's data-parallel tests on CPU replicas, against LibTorch 2.11 (gradient hooks, buckets,
#      failures);
#   2. equality: the same batches trained on GPU 0 alone and on GPUs 0,1 (bf16_mixed, small Llama):
#      loss and gradient norm within 2% at every step, replica weights bit-identical;
#   3. the same check with one process per GPU (NCCL unique id handed to each rank, DataParallelOptions.world_size);
#   4. scaling: Llama-3.2-1B (bench/model_configs.py), bf16, 8 x 2048 on one GPU vs 16 x 2048 on two:
#      tokens/s and the all-reduce time not hidden behind backward. Target: >= 1.9x.
# Carry .deps (deploy/device/fetch-deps.sh). Logs and JSON under ${OUT:-out}; a summary table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${OUT:-out}; mkdir -p "$LOGS"
source deploy/device/env.sh
declare -A RESULT
ORDER=()
run_phase() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  ORDER+=("$name")
  echo "== $name"
  if "$@" > "$LOGS/$name.log" 2>&1; then RESULT[$name]="ok ($((SECONDS - t0)) s)"; else RESULT[$name]="FAILED ($((SECONDS - t0)) s)"; fi
  tail -${TAIL_LINES:-20} "$LOGS/$name.log"
}
# The tool first, the test binary separately: a broken test elsewhere must not keep the tool from building.
TIGON_TARGETS="tigon_engine tigon-data-parallel" run_phase dp_build bash deploy/device/build.sh -DTIGON_BUILD_TESTS=ON
TIGON_TARGETS="tigon_engine_tests" run_phase dp_build_tests bash deploy/device/build.sh -DTIGON_BUILD_TESTS=ON
nvidia-smi topo -m > "$LOGS/topology.txt" 2>&1 || true
BIN=$TIGON_BUILD_DIR/engine/tigon-data-parallel
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
DEVICES=${TIGON_DP_DEVICES:-$(seq -s, 0 $((NGPU - 1)))}
echo "GPUs: $NGPU, devices used: $DEVICES"
run_phase dp_cpu_tests timeout -k 10 120 $TIGON_BUILD_DIR/tests/tigon_engine_tests --gtest_filter='DataParallel*'
TAIL_LINES=16 run_phase dp_equality timeout -k 10 120 $BIN check --devices "$DEVICES" --precision bf16_mixed --steps 8 \
  --rows 8 --seq 256 --tolerance 0.02
TAIL_LINES=16 run_phase dp_equality_fp32 timeout -k 10 90 $BIN check --devices "$DEVICES" --precision fp32 --steps 5 \
  --rows 8 --seq 256 --tolerance 1e-3
TAIL_LINES=14 run_phase dp_ranks_processes timeout -k 10 120 $BIN ranks --devices "$DEVICES" --precision bf16_mixed --steps 6 \
  --rows 8 --seq 256 --tolerance 0.02
$TIGON_PYTHON -c "import json, sys; sys.path.insert(0, 'bench'); from model_configs import MODELS; \
print(json.dumps(dict(MODELS['llama3.2-1b'], model_type='llama')))" > "$LOGS/llama3.2-1b.json"
TAIL_LINES=12 run_phase dp_scaling_llama1b timeout -k 10 240 $BIN bench --devices "$DEVICES" --config "$LOGS/llama3.2-1b.json" \
  --precision bf16 --rows-per-device 8 --seq 2048 --steps 8 --warmup 2 --json "$LOGS/dp_scaling_llama1b.json"
echo; echo "| phase | result |"; echo "| --- | --- |"
for k in "${ORDER[@]}"; do echo "| $k | ${RESULT[$k]} |"; done
