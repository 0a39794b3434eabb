#!/usr/bin/env bash
# On a machine with two or more GPUs (nvidia-h200-x2): why data parallelism scales as it does, then the
# correctness checks. About 6-7 minutes with the build; phases that would start after TIGON_DP_BUDGET_S
# seconds (default 360) are skipped, and each has a timeout, so that the run stays under 8 minutes.
#   1. scaling, Llama-3.2-1B (bench/model_configs.py), bf16, 8 x 2048 rows per GPU, one thread per GPU in
#      one process: each GPU alone, a data-parallel session with one replica, all GPUs; per-replica
#      forward/backward/wait/update; Kineto traces of two steps (one GPU alone, all GPUs);
#   2. the same scaling with one process per GPU (NCCL ranks, DataParallelOptions.world_size);
#   3. the traces per device (bench/analyze_trace.py --per-device): busy time, idle gaps, NCCL overlap,
#      launch waits, kernel times against the one-GPU trace;
#   4. equality (tests/engine/test_data_parallel_devices.cpp and test_data_parallel.cpp): the CPU-replica
#      tests against LibTorch 2.11; GPU 0 alone against all GPUs (bf16_mixed and fp32, small Llama), a
#      failure injected inside the NCCL sums, the same equality with one process per GPU (a skipped CUDA
#      case fails the phase: this machine has the GPUs they need); one session over two servers
#      (tests/gpu/service/test_world_gpu.py).
# Carry .deps (deploy/device/fetch-deps.sh). Logs, JSON and gzipped traces under ${OUT:-out}; a summary
# table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOGS=${OUT:-out}; mkdir -p "$LOGS"
source deploy/device/env.sh
BUDGET=${TIGON_DP_BUDGET_S:-360}
declare -A RESULT
ORDER=()
run_phase() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  ORDER+=("$name")
  if (( SECONDS > BUDGET )); then RESULT[$name]="skipped (past ${BUDGET} s)"; echo "== $name: skipped"; return; fi
  echo "== $name"
  if "$@" > "$LOGS/$name.log" 2>&1; then RESULT[$name]="ok ($((SECONDS - t0)) s)"; else RESULT[$name]="FAILED ($((SECONDS - t0)) s)"; fi
  tail -${TAIL_LINES:-20} "$LOGS/$name.log"
}
# The benchmark first, the test binary later: a broken test elsewhere must not keep the benchmark from building.
TIGON_TARGETS="tigon_engine tigon-data-parallel-bench" run_phase dp_build bash deploy/device/build.sh \
  -DTIGON_BUILD_TESTS=ON
BIN=$TIGON_BUILD_DIR/bench/tigon-data-parallel-bench
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
DEVICES=${TIGON_DP_DEVICES:-$(seq -s, 0 $((NGPU - 1)))}
echo "GPUs: $NGPU, devices used: $DEVICES"
{ nvidia-smi topo -m; nproc; lscpu | grep -iE "model name|numa"; } > "$LOGS/topology.txt" 2>&1 || true
GPU_QUERY=index,name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu
nvidia-smi --query-gpu=$GPU_QUERY --format=csv > "$LOGS/gpus_before.csv" 2>&1 || true
$TIGON_PYTHON -c "import json, sys; sys.path.insert(0, 'bench'); from model_configs import MODELS; \
print(json.dumps(dict(MODELS['llama3.2-1b'], model_type='llama')))" > "$LOGS/llama3.2-1b.json"
export NCCL_DEBUG=${NCCL_DEBUG:-VERSION}
# Clocks and power while the benchmarks run, every 250 ms: do the GPUs slow down when both are busy?
nvidia-smi --query-gpu=index,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv,noheader,nounits -lms 250 > "$LOGS/gpus_during_bench.csv" 2>/dev/null &
SAMPLER=$!
BENCH_ARGS=(--devices "$DEVICES" --config "$LOGS/llama3.2-1b.json" --precision bf16 --rows-per-device 8 --seq 2048
            --steps 20 --warmup 100)  # 100 warm-up steps: about 25 s, the clocks' steady state (see the benchmark)
TAIL_LINES=24 run_phase dp_scaling_threads timeout -k 10 300 $BIN "${BENCH_ARGS[@]}" \
  --profile "$LOGS/profile" --json "$LOGS/dp_scaling_threads.json"
nvidia-smi --query-gpu=$GPU_QUERY --format=csv > "$LOGS/gpus_after_threads.csv" 2>&1 || true
TAIL_LINES=14 run_phase dp_scaling_processes timeout -k 10 240 $BIN "${BENCH_ARGS[@]}" --processes \
  --json "$LOGS/dp_scaling_processes.json"
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
if [[ -f $LOGS/profile/data_parallel.json ]]; then
  TAIL_LINES=60 run_phase dp_trace_analysis timeout -k 10 90 bash -c "
    $TIGON_PYTHON bench/analyze_trace.py $LOGS/profile/data_parallel.json --steps 2 --per-device \
      --baseline $LOGS/profile/one_device.json --summary-json $LOGS/trace_devices.json &&
    echo && echo '# one device alone' &&
    $TIGON_PYTHON bench/analyze_trace.py $LOGS/profile/one_device.json --steps 2 --per-device --top 10 \
      --summary-json $LOGS/trace_one_device.json"
  gzip -f "$LOGS"/profile/*.json 2>/dev/null || true
fi
TIGON_TARGETS="tigon_engine_tests tigon-server" run_phase dp_build_tests bash deploy/device/build.sh -DTIGON_BUILD_TESTS=ON
# GPU 0 alone against all GPUs, a failure inside the NCCL sums, one process per GPU; the tests use every
# visible device, so TIGON_DP_DEVICES narrows them through CUDA_VISIBLE_DEVICES.
TAIL_LINES=24 run_phase dp_equality timeout -k 10 240 env CUDA_VISIBLE_DEVICES="$DEVICES" bash -c '
  out=$("$0" --gtest_filter="DataParallelDevices.Cuda*" 2>&1); rc=$?; echo "$out"
  [[ $rc == 0 && $out != *"[  SKIPPED ]"* ]]' "$TIGON_BUILD_DIR/tests/tigon_engine_tests"
# One session over two servers, one GPU each (tigon.WorldSession), against one server on one GPU.
run_phase dp_two_servers timeout -k 10 120 env TIGON_SERVER_BIN=$PWD/$TIGON_BUILD_DIR/server/tigon-server \
  PYTHONPATH=$PWD/client/python $TIGON_PYTHON -m pytest -q tests/gpu/service/test_world_gpu.py
run_phase dp_cpu_tests timeout -k 10 60 $TIGON_BUILD_DIR/tests/tigon_engine_tests \
  --gtest_filter='DataParallel.*:DataParallelDevices.Cpu*'
echo; echo "| phase | result |"; echo "| --- | --- |"
for k in "${ORDER[@]}"; do echo "| $k | ${RESULT[$k]} |"; done
# The numbers that tell where the time goes, from the JSON written above.
$TIGON_PYTHON - "$LOGS" <<'EOF' || true
import json, os, sys
logs = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(logs, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
rows = []
for name, label in (("dp_scaling_threads.json", "threads"), ("dp_scaling_processes.json", "processes")):
    bench = load(name)
    if not bench:
        rows.append((f"bench, {label}", "no result"))
        continue
    for run in bench.get("runs", []):
        if label == "processes" and not run["data_parallel"]:
            continue
        rows.append((run["run"], f"{run['tokens_per_second']:,.0f} tok/s, step {run['step_ms']:.1f} ms"))
        for i, r in enumerate(run.get("replicas", [])):
            rows.append((f"  replica {i} ({r['device']})",
                         f"forward {r['forward_ms']:.1f} / backward {r['backward_ms']:.1f} / wait {r['wait_ms']:.1f} / "
                         f"update {r['update_ms']:.1f} ms (host forward {r['host_forward_ms']:.1f})"))
    rows.append((f"speed-up, {label}", f"{bench['speedup']:.3f}x (goal >= 1.9x); all-reduce {bench['allreduce_ms']:.1f} ms, "
                 f"not hidden {bench['exposed_ms']:.1f} ms"))
for name, label in (("trace_one_device.json", "trace, one device alone"), ("trace_devices.json", "trace, all devices")):
    devices = load(name)
    for device, d in (devices or {}).items():
        rows.append((f"{label}: GPU {device}",
                     f"busy {d['busy_ms']:.1f} of {d['span_ms']:.1f} ms ({100 * d['busy_share']:.0f}%), longest gap "
                     f"{d['longest_gap_ms']:.2f} ms, nccl {d['nccl_ms']:.1f} ms ({d['nccl_overlapping_compute_ms']:.1f} "
                     f"over compute), launch wait median {d['launch_wait_median_us']:.0f} us, "
                     f"{100 * d['kernels_waited_under_50us_share']:.0f}% of kernels waited < 50 us, "
                     f"cudaLaunchKernel {d.get('launch_call_mean_us', float('nan')):.1f} us"))
# GPU clocks from the sampler: each GPU busy alone (the other idle) against both busy.
samples = []
try:
    with open(os.path.join(logs, "gpus_during_bench.csv")) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 6:
                samples.append([float(p) if p.replace(".", "", 1).isdigit() else float("nan") for p in parts])
except OSError:
    pass
gpus = sorted({int(s[0]) for s in samples})
if len(gpus) > 1:
    blocks = [samples[i:i + len(gpus)] for i in range(0, len(samples) - len(gpus) + 1, len(gpus))]
    blocks = [b for b in blocks if [int(s[0]) for s in b] == gpus]
    for gpu in gpus:
        alone, both = [], []
        for b in blocks:
            busy = {int(s[0]): s[1] > 50 for s in b}
            this = next(s for s in b if int(s[0]) == gpu)
            if busy[gpu] and all(busy.values()):
                both.append(this)
            elif busy[gpu] and not any(v for g, v in busy.items() if g != gpu):
                alone.append(this)
        def describe(group):
            if not group:
                return "no samples"
            med = lambda i: sorted(s[i] for s in group)[len(group) // 2]
            return f"SM {med(2):.0f} MHz, {med(4):.0f} W, {med(5):.0f} C ({len(group)} samples)"
        rows.append((f"GPU {gpu} clocks busy alone / with the others busy", f"{describe(alone)} / {describe(both)}"))
print("\n| measurement | value |\n| --- | --- |")
for k, v in rows:
    print(f"| {k} | {v} |")
EOF
