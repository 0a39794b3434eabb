"""Sums the GPU kernel time of a Chrome trace written by tigon-profile-step or tigon-data-parallel-bench
--profile (Kineto) by category and by kernel, so one can see where a training step's device time goes.

    python3 bench/analyze_trace.py out/trace.json --steps 2
    python3 bench/analyze_trace.py out/profile/data_parallel.json --steps 2 --per-device \
        [--baseline out/profile/one_device.json]

--per-device adds, for each GPU: busy time (the union of its kernels, so overlapping streams count once),
idle gaps, the top kernels, how much NCCL kernel time overlaps compute kernels on the same device, and how
long kernels waited between their launch call on the host and their start on the device (a short wait for
most kernels means the device was waiting for the host); then the host CUDA calls that took the most time
(synchronisations, allocations, launches). --baseline compares each device's kernel time by category, its
top kernels and the mean time of host CUDA calls with another trace (e.g. one device alone).

--streams lists each CUDA stream's busy time and its idle gaps between kernels, longest first, with the
kernels on either side: a compute-stream gap that another stream's kernel fills is time the two streams
did not overlap. --matmul-shapes (for a trace recorded with tigon-profile-step --shapes) sums the matmul
kernels by the operator and operand shapes that launched them.
"""
import argparse
import gzip
import json
import re
import statistics
from collections import defaultdict

# First match wins; names are CUDA kernel names as Kineto records them.
CATEGORIES = [
    ("attention (flash/SDPA)", r"flash|fmha|attention|sdpa"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_|cublas|splitK"),
    ("tigon fused ops", r"tigon"),
    ("nccl", r"nccl"),
    ("copy/fill", r"copy|Memcpy|Memset|fill|cat|index|gather|scatter|embedding"),
    ("elementwise/reduce (ATen)", r"elementwise|vectorized|reduce|unrolled|Reduce"),
]
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Host calls that put work on a device; their correlation id links them to the kernel or copy they queued.
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
NCCL = re.compile(r"nccl", re.I)


def category_of(name):
    return next((c for c, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")


def load(path):
    """A trace as written, or gzip-compressed (.gz), as the device scripts keep them."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["traceEvents"]


def gpu_events(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]


def device_of(event):
    args = event.get("args") or {}
    device = args.get("device")
    return int(device) if device is not None else int(event.get("pid", 0))


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def total(intervals):
    return sum(end - start for start, end in intervals)


def intersection(a, b):
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    out = 0.0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summarize(kernels, steps, top):
    """The original whole-trace summary: busy time, categories, top kernels."""
    by_name = defaultdict(lambda: [0.0, 0])
    by_category = defaultdict(float)
    for e in kernels:
        name = e["name"]
        by_name[name][0] += e["dur"]
        by_name[name][1] += 1
        by_category[category_of(name)] += e["dur"]
    busy = sum(e["dur"] for e in kernels) / steps
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) / steps
    print(f"per step: GPU busy {busy / 1e3:.1f} ms over a span of {span / 1e3:.1f} ms ({100 * busy / span:.1f}% busy)")
    devices = len({device_of(e) for e in kernels})
    if devices > 1:
        print(f"({devices} devices: busy time above is summed over them; --per-device splits it)")
    print("\n| category | ms/step | share |\n| --- | --- | --- |")
    for category, us in sorted(by_category.items(), key=lambda kv: -kv[1]):
        print(f"| {category} | {us / steps / 1e3:.2f} | {100 * us / steps / busy:.1f}% |")
    print(f"\n| kernel (top {top}) | ms/step | calls/step |\n| --- | --- | --- |")
    for name, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name[:110]} | {us / steps / 1e3:.2f} | {calls / steps:.0f} |")


def by_device(kernels):
    out = defaultdict(list)
    for e in kernels:
        out[device_of(e)].append(e)
    return dict(sorted(out.items()))


def launch_waits(events, kernels):
    """Per kernel, microseconds from the start of its host launch call to its start on the device."""
    launches = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES:
            correlation = (e.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = e["ts"]
    waits = []
    for e in kernels:
        correlation = (e.get("args") or {}).get("correlation")
        if correlation in launches:
            waits.append(e["ts"] - launches[correlation])
    return waits


def device_report(events, kernels, steps, top, gap_us):
    """Per-device busy time, idle gaps, NCCL overlap, launch waits and top kernels."""
    devices = by_device(kernels)
    print(f"\n## Per device ({len(devices)} device(s), times per step)")
    print("\n| device | kernels/step | span ms | busy ms | busy | idle ms | gaps > "
          f"{gap_us / 1e3:g} ms (count, ms) | longest gap ms | nccl ms | nccl overlapping compute ms | "
          "compute-only busy ms | launch→start wait median µs | kernels waited < 50 µs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = {}
    for device, items in devices.items():
        start = min(e["ts"] for e in items)
        end = max(e["ts"] + e["dur"] for e in items)
        busy = union([(e["ts"], e["ts"] + e["dur"]) for e in items])
        nccl = union([(e["ts"], e["ts"] + e["dur"]) for e in items if NCCL.search(e["name"])])
        compute = union([(e["ts"], e["ts"] + e["dur"]) for e in items if not NCCL.search(e["name"])])
        gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
        long_gaps = [g for g in gaps if g > gap_us]
        waits = launch_waits(events, items)
        span = end - start
        idle = span - total(busy)
        short = (100.0 * sum(1 for w in waits if w < 50) / len(waits)) if waits else float("nan")
        median_wait = statistics.median(waits) if waits else float("nan")
        rows[device] = {
            "span_ms": span / steps / 1e3, "busy_ms": total(busy) / steps / 1e3, "busy_share": total(busy) / span,
            "idle_ms": idle / steps / 1e3, "longest_gap_ms": max(gaps, default=0) / 1e3,
            "nccl_ms": total(nccl) / steps / 1e3, "nccl_overlapping_compute_ms": intersection(nccl, compute) / steps / 1e3,
            "launch_wait_median_us": median_wait, "kernels_waited_under_50us_share": short / 100.0,
        }
        print(f"| {device} | {len(items) / steps:.0f} | {span / steps / 1e3:.1f} | {total(busy) / steps / 1e3:.1f} | "
              f"{100 * total(busy) / span:.1f}% | {idle / steps / 1e3:.1f} | {len(long_gaps) / steps:.0f}, "
              f"{sum(long_gaps) / steps / 1e3:.1f} | {max(gaps, default=0) / 1e3:.2f} | {total(nccl) / steps / 1e3:.2f} | "
              f"{intersection(nccl, compute) / steps / 1e3:.2f} | {total(compute) / steps / 1e3:.1f} | "
              f"{median_wait:.0f} | {short:.0f}% |")
    for device, items in devices.items():
        by_name = defaultdict(lambda: [0.0, 0])
        for e in items:
            by_name[e["name"]][0] += e["dur"]
            by_name[e["name"]][1] += 1
        print(f"\n| device {device}: kernel (top {top}) | ms/step | calls/step | mean µs |\n| --- | --- | --- | --- |")
        for name, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"| {name[:100]} | {us / steps / 1e3:.2f} | {calls / steps:.0f} | {us / calls:.1f} |")
    return rows


def host_api_calls(events):
    """Host CUDA runtime/driver calls by name: [total µs, calls]. Synchronisations, allocations and memory
    mappings show here, and launches that take longer when replicas share a process."""
    out = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES:
            out[e["name"]][0] += e.get("dur", 0)
            out[e["name"]][1] += 1
    return out


def host_api_report(events, steps, top):
    calls = host_api_calls(events)
    if not calls:
        return {}
    print(f"\n| host CUDA call (top {top} by time, all threads) | ms/step | calls/step | mean µs |\n"
          "| --- | --- | --- | --- |")
    for name, (us, count) in sorted(calls.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {us / steps / 1e3:.2f} | {count / steps:.0f} | {us / count:.1f} |")
    return {name: us / count for name, (us, count) in calls.items()}


def compare(kernels, baseline_kernels, steps, baseline_steps, top):
    """Each device's kernel time by category and its top kernels against the baseline trace's (all devices
    of the baseline together, normally one)."""
    def per_category(items, n):
        out = defaultdict(float)
        for e in items:
            out[category_of(e["name"])] += e["dur"] / n / 1e3
        return out

    def per_name(items, n):
        out = defaultdict(lambda: [0.0, 0])
        for e in items:
            out[e["name"]][0] += e["dur"] / n / 1e3
            out[e["name"]][1] += 1
        return out

    base_category = per_category(baseline_kernels, baseline_steps)
    base_name = per_name(baseline_kernels, baseline_steps)
    for device, items in by_device(kernels).items():
        category = per_category(items, steps)
        print(f"\n| device {device} vs baseline: category | ms/step here | ms/step baseline | ratio |\n"
              "| --- | --- | --- | --- |")
        for name in sorted(set(category) | set(base_category), key=lambda c: -category.get(c, 0.0)):
            here, base = category.get(name, 0.0), base_category.get(name, 0.0)
            ratio = f"{here / base:.2f}" if base > 0 else "-"
            print(f"| {name} | {here:.2f} | {base:.2f} | {ratio} |")
        names = per_name(items, steps)
        print(f"\n| device {device} vs baseline: kernel (top {top} here) | mean µs here | mean µs baseline | ratio |\n"
              "| --- | --- | --- | --- |")
        for name, (ms, calls) in sorted(names.items(), key=lambda kv: -kv[1][0])[:top]:
            here = 1e3 * ms * steps / calls
            if name in base_name:
                base_ms, base_calls = base_name[name]
                base = 1e3 * base_ms * baseline_steps / base_calls
                print(f"| {name[:100]} | {here:.1f} | {base:.1f} | {here / base:.2f} |")
            else:
                print(f"| {name[:100]} | {here:.1f} | - | - |")


def stream_report(kernels, steps, longest):
    """Per (device, stream): kernels, busy ms, idle gaps between consecutive kernels by size, the longest."""
    streams = defaultdict(list)
    for e in kernels:
        streams[(device_of(e), e.get("tid"))].append(e)
    start = min(e["ts"] for e in kernels)
    print("\n| device, stream | kernels/step | busy ms/step | gaps ms/step: < 20 µs | 20 µs-1 ms | >= 1 ms |"
          "\n| --- | --- | --- | --- | --- | --- |")
    for key, items in sorted(streams.items(), key=lambda kv: -len(kv[1])):
        items.sort(key=lambda e: e["ts"])
        gaps = [(b["ts"] - (a["ts"] + a["dur"]), a, b) for a, b in zip(items, items[1:])]
        gaps = [g for g in gaps if g[0] > 0]
        sums = [sum(g for g, _, _ in gaps if lo <= g < hi) / steps / 1e3 for lo, hi in ((0, 20), (20, 1e3), (1e3, 1e18))]
        print(f"| {key[0]}, {key[1]} | {len(items) / steps:.0f} | {sum(e['dur'] for e in items) / steps / 1e3:.1f} | "
              f"{sums[0]:.2f} | {sums[1]:.2f} | {sums[2]:.2f} |")
    for key, items in sorted(streams.items(), key=lambda kv: -len(kv[1]))[:2]:
        gaps = sorted(((b["ts"] - (a["ts"] + a["dur"]), a, b) for a, b in zip(items, items[1:])), key=lambda g: -g[0])
        print(f"\n| device {key[0]}, stream {key[1]}: longest gaps | ms | at ms | after | before |\n| --- | --- | --- | --- | --- |")
        for gap, a, b in gaps[:longest]:
            print(f"| | {gap / 1e3:.2f} | {(a['ts'] + a['dur'] - start) / 1e3:.1f} | {a['name'][:50]} | {b['name'][:50]} |")


def matmul_shapes_report(events, kernels, steps, top):
    """Matmul kernels summed by the CPU operator that launched them (Kineto's External id links the two) and
    its input shapes, which the trace holds when it was recorded with input shapes."""
    ops = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "External id" in args:
            ops[args["External id"]] = (e["name"], str(args.get("Input Dims", "")))
    gemm = re.compile(CATEGORIES[1][1], re.I)
    totals = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        if gemm.search(e["name"]) and not re.search(CATEGORIES[0][1], e["name"], re.I):
            key = ops.get((e.get("args") or {}).get("External id"), ("(no operator)", ""))
            totals[key][0] += e["dur"]
            totals[key][1] += 1
    if not any(dims for _, dims in totals):
        print("\n(no input shapes in the trace: record it with tigon-profile-step --shapes)")
    print(f"\n| matmul operator (top {top}) | input shapes | ms/step | calls/step | mean µs |\n| --- | --- | --- | --- | --- |")
    for (name, dims), (us, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"| {name} | {dims[:100]} | {us / steps / 1e3:.2f} | {calls / steps:.0f} | {us / calls:.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="profiled steps in the trace (times are per step)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--per-device", action="store_true",
                        help="busy time, idle gaps, NCCL overlap, launch waits and top kernels of each GPU")
    parser.add_argument("--gap-ms", type=float, default=0.1, help="idle gaps longer than this are counted")
    parser.add_argument("--baseline", help="another trace to compare each device's kernel times with")
    parser.add_argument("--baseline-steps", type=int, default=None, help="profiled steps in the baseline trace")
    parser.add_argument("--summary-json", help="with --per-device: write each device's numbers to this file")
    parser.add_argument("--streams", action="store_true", help="busy time and idle gaps of each CUDA stream")
    parser.add_argument("--matmul-shapes", action="store_true",
                        help="matmul kernel time by operator and input shapes (traces recorded with --shapes)")
    args = parser.parse_args()
    events = load(args.trace)
    kernels = gpu_events(events)
    if not kernels:
        raise SystemExit("no GPU kernels in the trace")
    summarize(kernels, args.steps, args.top)
    if args.streams:
        stream_report(kernels, args.steps, min(args.top, 15))
    if args.matmul_shapes:
        matmul_shapes_report(events, kernels, args.steps, args.top)
    if args.per_device:
        rows = device_report(events, kernels, args.steps, min(args.top, 15), 1e3 * args.gap_ms)
        mean_us = host_api_report(events, args.steps, min(args.top, 15))
        for row in rows.values():
            row["launch_call_mean_us"] = mean_us.get("cudaLaunchKernel", float("nan"))
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump({str(device): row for device, row in rows.items()}, f, indent=1)
    if args.baseline:
        baseline_events = load(args.baseline)
        baseline = gpu_events(baseline_events)
        if not baseline:
            raise SystemExit("no GPU kernels in the baseline trace")
        compare(kernels, baseline, args.steps, args.baseline_steps or args.steps, min(args.top, 15))
        here, there = host_api_calls(events), host_api_calls(baseline_events)
        common = sorted(set(here) & set(there), key=lambda name: -here[name][0])[:10]
        if common:
            print("\n| host CUDA call vs baseline | mean µs here | mean µs baseline | ratio |\n| --- | --- | --- | --- |")
            for name in common:
                a, b = here[name][0] / here[name][1], there[name][0] / there[name][1]
                print(f"| {name} | {a:.1f} | {b:.1f} | {a / b if b > 0 else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
