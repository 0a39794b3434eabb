"""Sums the GPU kernel time of a Chrome trace written by tigon-profile-step (Kineto) by category and by
kernel, so one can see where a training step's device time goes.

    python3 bench/analyze_trace.py out/trace.json --steps 2
"""
import argparse
import json
import re
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="profiled steps in the trace (times are per step)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        raise SystemExit("no GPU kernels in the trace")
    by_name = defaultdict(lambda: [0.0, 0])
    by_category = defaultdict(float)
    for e in kernels:
        name = e["name"]
        by_name[name][0] += e["dur"]
        by_name[name][1] += 1
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")
        by_category[category] += e["dur"]
    busy = sum(e["dur"] for e in kernels) / args.steps
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) / args.steps
    print(f"per step: GPU busy {busy / 1e3:.1f} ms over a span of {span / 1e3:.1f} ms ({100 * busy / span:.1f}% busy)")
    print("\n| category | ms/step | share |\n| --- | --- | --- |")
    for category, us in sorted(by_category.items(), key=lambda kv: -kv[1]):
        print(f"| {category} | {us / args.steps / 1e3:.2f} | {100 * us / args.steps / busy:.1f}% |")
    print(f"\n| kernel (top {args.top}) | ms/step | calls/step |\n| --- | --- | --- |")
    for name, (us, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"| {name[:110]} | {us / args.steps / 1e3:.2f} | {calls / args.steps:.0f} |")


if __name__ == "__main__":
    main()
