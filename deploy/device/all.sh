#!/usr/bin/env bash
# On the GPU machine, in one go: build (keep going past failures), GPU kernel tests, the engine test suite
# on the GPU, a short training run, and the kernel benchmarks. Prints a summary table last; logs under
# ${OUT:-out}. Phases can be chosen: all.sh [build] [gputest] [enginetest] [train] [bench] [e2e] (and the
# others below, e.g. maxseq8b and profile).
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${OUT:-out}; mkdir -p "$LOGS"
PHASES=${*:-build gputest enginetest train bench}
declare -A RESULT
run_phase() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name"
  if "$@" > "$LOGS/$name.log" 2>&1; then RESULT[$name]="ok ($((SECONDS - t0)) s)"; else RESULT[$name]="FAILED ($((SECONDS - t0)) s)"; fi
  tail -${TAIL_LINES:-15} "$LOGS/$name.log"
}
source deploy/device/env.sh
export TIGON_KERNELS_LIB=$PWD/$TIGON_BUILD_DIR/kernels/libtigon_kernels.so
for phase in $PHASES; do
  case $phase in
    build) run_phase build bash -c "bash deploy/device/build.sh -DTIGON_BUILD_TESTS=ON; ninja -C $TIGON_BUILD_DIR -k 0 -j \$(nproc) 2>&1 | grep -E 'error|FAILED' | head -40; ninja -C $TIGON_BUILD_DIR -n | grep -c . ";;
    gputest) run_phase gputest $TIGON_PYTHON -m pytest -q --timeout=300 tests/gpu/kernels ;;
    gpuservice) run_phase gpuservice env TIGON_SERVER_BIN=$PWD/$TIGON_BUILD_DIR/server/tigon-server PYTHONPATH=$PWD/client/python $TIGON_PYTHON -m pytest -q --timeout=600 tests/gpu/service ;;
    modeltest) run_phase modeltest $TIGON_BUILD_DIR/tests/tigon_model_tests ;;
    maxseq8b) run_phase maxseq_llama8b $TIGON_PYTHON bench/e2e_bench.py --server-bin $TIGON_BUILD_DIR/server/tigon-server --model llama3-8b --max-seq --seqs ${TIGON_MAXSEQ:-32768 40960} --kernels fused ${TIGON_E2E_ARGS:-} --out "$LOGS/maxseq_llama8b.json" ;;
    profile) for spec in ${TIGON_PROFILE_MODELS:-llama3-8b:8:1024 llama3.2-1b:8:2048}; do
        IFS=: read -r model b t <<< "$spec"
        $TIGON_PYTHON -c "import json,sys; sys.path.insert(0,'bench'); from model_configs import MODELS; print(json.dumps(dict(MODELS['$model'], model_type='llama')))" > "$LOGS/$model.json"
        TAIL_LINES=45 run_phase profile_$model bash -c "$TIGON_BUILD_DIR/bench/tigon-profile-step --config $LOGS/$model.json --batch $b --seq $t --shapes --trace $LOGS/trace_$model.json ${TIGON_PROFILE_ARGS:-} && $TIGON_PYTHON bench/analyze_trace.py $LOGS/trace_$model.json --steps 2 --streams --matmul-shapes && gzip -f $LOGS/trace_$model.json"
      done ;;
    enginetest) run_phase enginetest $TIGON_BUILD_DIR/tests/tigon_engine_tests ;;
    train) run_phase train $TIGON_BUILD_DIR/engine/tigon-train --steps 100 --batch 16 --seq 256 --hidden 256 --layers 4 --precision bf16_mixed ;;
    bench) for s in bench/bench_*.py; do n=$(basename $s .py); TAIL_LINES=25 run_phase $n $TIGON_PYTHON $s --out "$LOGS/$n.json"; done ;;
    hf) run_phase hf_llama1b $TIGON_PYTHON bench/hf_baseline.py --model llama3.2-1b --batch 8 --seq 2048 --out "$LOGS/hf_llama1b.json" ;;
    hf8b) run_phase hf_llama8b $TIGON_PYTHON bench/hf_baseline.py --model llama3-8b --batch 8 --seq 1024 --out "$LOGS/hf_llama8b.json" ;;
    e2e8b) run_phase e2e_llama8b $TIGON_PYTHON bench/e2e_bench.py --server-bin $TIGON_BUILD_DIR/server/tigon-server --model llama3-8b --batch 8 --seq 1024 --kernels fused ${TIGON_E2E_ARGS:-} --out "$LOGS/e2e_llama8b.json" ;;
    objectivetest) run_phase objectivetest bash -c "$TIGON_BUILD_DIR/tests/tigon_objective_tests && $TIGON_BUILD_DIR/tests/tigon_engine_tests --gtest_filter='ObjectiveSessions*'" ;;
    objectives) B=$TIGON_BUILD_DIR/bench/tigon-objective-head-bench
      TAIL_LINES=12 run_phase objectives bash -c "set -e; $B --loss dpo --reference-head; $B --loss dpo; $B --loss cross_entropy; $B --loss importance_sampling; $TIGON_PYTHON bench/objective_heads.py --provider torch; $TIGON_PYTHON bench/objective_heads.py --provider liger; $TIGON_PYTHON bench/objective_heads.py --compare --tigon-bench $B" ;;
    e2erl) run_phase e2e_rl_llama8b $TIGON_PYTHON bench/e2e_bench.py --server-bin $TIGON_BUILD_DIR/server/tigon-server --model llama3-8b --batch 8 --seq 1024 --kernels fused --loss-fn cross_entropy importance_sampling cross_entropy importance_sampling --out "$LOGS/e2e_rl_llama8b.json" ;;
    e2e) run_phase e2e_llama1b $TIGON_PYTHON bench/e2e_bench.py --server-bin $TIGON_BUILD_DIR/server/tigon-server --model llama3.2-1b --batch 8 --seq 2048 --kernels fused reference ${TIGON_E2E_ARGS:-} --out "$LOGS/e2e_llama1b.json" ;;
  esac
done
echo; echo "| phase | result |"; echo "| --- | --- |"
for k in "${!RESULT[@]}"; do echo "| $k | ${RESULT[$k]} |"; done
