"""bench/analyze_trace.py on a small synthetic Kineto trace: the per-stream gaps and the matmul-by-shapes
tables report the numbers the trace implies."""
import gzip
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def kernel(name, ts, dur, stream, external_id=None):
    args = {"device": 0, "stream": stream}
    if external_id is not None:
        args["External id"] = external_id
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream, "args": args}


def cpu_op(name, external_id, dims):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": 0, "dur": 1, "pid": 1, "tid": 1,
            "args": {"External id": external_id, "Input Dims": dims}}


def run(tmp_path, events, *flags):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    out = subprocess.run([sys.executable, str(ROOT / "bench/analyze_trace.py"), str(path), "--steps", "1", *flags],
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_streams_report_busy_time_and_gaps_by_size(tmp_path):
    # Stream 7: kernels of 100 µs with gaps of 10 µs, 300 µs and 2000 µs; stream 9: one 500 µs kernel.
    events = [kernel("nvjet_a", 0, 100, 7), kernel("rms_norm_forward", 110, 100, 7),
              kernel("nvjet_b", 510, 100, 7), kernel("glu_backward", 2610, 100, 7), kernel("adamw_step", 200, 500, 9)]
    text = run(tmp_path, events, "--streams")
    rows = [line for line in text.splitlines() if line.startswith("| 0, ")]
    assert rows[0].split("|")[1:7] == [" 0, 7 ", " 4 ", " 0.4 ", " 0.01 ", " 0.30 ", " 2.00 "], rows
    assert rows[1].split("|")[1:4] == [" 0, 9 ", " 1 ", " 0.5 "], rows
    longest = next(line for line in text.splitlines() if line.startswith("| | 2.00 |"))
    assert "nvjet_b" in longest and "glu_backward" in longest


def test_matmul_shapes_sums_kernels_by_operator_and_shapes(tmp_path):
    events = [cpu_op("aten::mm", 1, [[8, 4], [4, 16]]), cpu_op("aten::mm", 2, [[8, 4], [4, 16]]),
              cpu_op("aten::addmm_", 3, [[16, 4], [16, 8], [8, 4], [], []]),
              kernel("nvjet_sm90_tst_128x256", 0, 300, 7, 1), kernel("nvjet_sm90_tst_128x256", 400, 500, 7, 2),
              kernel("sm90_xmma_gemm_bf16", 1000, 200, 7, 3), kernel("glu_forward", 1300, 50, 7, 3)]
    text = run(tmp_path, events, "--matmul-shapes")
    rows = {line.split("|")[1].strip() + line.split("|")[2].strip(): line.split("|")[3:6]
            for line in text.splitlines() if line.startswith("| aten::")}
    assert rows["aten::mm[[8, 4], [4, 16]]"] == [" 0.80 ", " 2 ", " 400 "], rows
    assert rows["aten::addmm_[[16, 4], [16, 8], [8, 4], [], []]"] == [" 0.20 ", " 1 ", " 200 "], rows
    assert "no input shapes" not in text
