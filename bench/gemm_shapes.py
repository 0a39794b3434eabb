#!/usr/bin/env python3
"""The matmuls of one decoder layer at a given width, timed alone: forward (y = x W^T), the input gradient
(dx = dy W) and the weight gradient (dW = dy^T x), each as cuBLAS runs it through torch, in TFLOP/s.
Also the q/k/v and gate/up projections as one matmul over the concatenated weights, to see what fusing
them would gain. Needs a CUDA GPU.

    python3 bench/gemm_shapes.py --tokens 8192 --hidden 4096 --kv 1024 --intermediate 14336 [--out r.json]
"""
import argparse
import json
import statistics

import torch


def time_ms(fn, repeat=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def projection(tokens, in_features, outs, dtype):
    """Forward and both gradients for several linears of one input: separately and as one matmul."""
    x = torch.randn(tokens, in_features, device="cuda", dtype=dtype)
    weights = [torch.randn(n, in_features, device="cuda", dtype=dtype) * 0.02 for n in outs]
    grads = [torch.randn(tokens, n, device="cuda", dtype=dtype) for n in outs]
    fused_w = torch.cat(weights)
    fused_g = torch.cat(grads, dim=1)
    flops = 2 * tokens * in_features * sum(outs)

    def separate_dx():
        dx = grads[0] @ weights[0]
        for g, w in zip(grads[1:], weights[1:]):
            dx.addmm_(g, w)
    parts = dict(
        forward=(lambda: [x @ w.t() for w in weights], lambda: x @ fused_w.t()),
        input_grad=(separate_dx, lambda: fused_g @ fused_w),
        weight_grad=(lambda: [g.t() @ x for g in grads], lambda: fused_g.t() @ x),
    )
    out = {}
    for part, (separate, fused) in parts.items():
        s, f = time_ms(separate), time_ms(fused)
        out[part] = dict(separate_ms=s, fused_ms=f, separate_tflops=flops / s / 1e9, fused_tflops=flops / f / 1e9)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads-dim", type=int, default=4096, help="q projection width")
    ap.add_argument("--kv", type=int, default=1024, help="k and v projection width each")
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--out")
    args = ap.parse_args()
    dtype = torch.bfloat16
    shapes = {
        "q,k,v": (args.hidden, [args.heads_dim, args.kv, args.kv]),
        "o_proj": (args.heads_dim, [args.hidden]),
        "gate,up": (args.hidden, [args.intermediate, args.intermediate]),
        "down_proj": (args.intermediate, [args.hidden]),
    }
    result = {}
    print(f"tokens {args.tokens}, bf16, median of 20 (ms, TFLOP/s)")
    print("| projection | part | separate | one matmul |\n| --- | --- | --- | --- |")
    total_sep = total_fused = 0.0
    for name, (k, outs) in shapes.items():
        r = projection(args.tokens, k, outs, dtype)
        result[name] = r
        for part, v in r.items():
            total_sep += v["separate_ms"]
            total_fused += v["fused_ms"]
            print(f"| {name} | {part} | {v['separate_ms']:.3f} / {v['separate_tflops']:.0f} | "
                  f"{v['fused_ms']:.3f} / {v['fused_tflops']:.0f} |")
    print(f"per layer: separate {total_sep:.2f} ms, with q/k/v and gate/up fused {total_fused:.2f} ms")
    result["per_layer_ms"] = dict(separate=total_sep, fused=total_fused)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
