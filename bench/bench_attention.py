#!/usr/bin/env python3
"""Causal attention forward + backward through each scaled_dot_product_attention backend, at a decoder's
attention shapes (default Llama-3-8B at batch 8 x 1024: q 8 x 32 x 1024 x 128, k and v 8 x 8 x ... , bf16).

Tigon's decoder calls at::scaled_dot_product_attention with is_causal and enable_gqa and lets LibTorch pick
the backend; this shows which one it picks (the "default" row matches one of the others) and what the
alternatives would cost, with grouped K/V (enable_gqa) and with K/V repeated to every query head as older
code does. Time: triton.testing.do_bench median (CUDA events) of forward + backward (gradients of q, k, v).
TFLOP/s counts the causal half of the products: forward 2 B Hq T^2 D, backward 2.5 times that. Each row
also gives the largest difference of its output and dq from the default backend's.
Prints a markdown table last; --out writes JSON.

    python3 bench/bench_attention.py --out out/attention.json
"""
import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "default": None,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=32, help="to show the per-step total")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    torch.manual_seed(0)
    b, t, hq, hk, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim
    groups = hq // hk

    def projection(heads):  # [B, H, T, D] views of [B, T, H, D], as the decoder passes them
        return torch.randn(b, t, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_(True)

    q, k, v = projection(hq), projection(hk), projection(hk)
    grad_out = torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16)
    flops = 3.5 * 2 * b * hq * t * t * d

    rows, reference = [], None
    for name, backend in BACKENDS.items():
        for gqa in (True, False):
            def step():
                kk, vv = (k, v) if gqa else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
                if backend is None:
                    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                else:
                    with sdpa_kernel([backend]):
                        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                dq, _, _ = torch.autograd.grad(out, (q, k, v), grad_out)
                return out, dq

            row = dict(backend=name, enable_gqa=gqa)
            try:
                out, dq = step()
            except RuntimeError as e:
                row["unavailable"] = str(e).splitlines()[0][:120]
                rows.append(row)
                continue
            if reference is None:
                reference = (out.float(), dq.float())
            ms = triton.testing.do_bench(step, warmup=args.warmup, rep=args.rep, return_mode="median")
            row.update(ms=ms, tflops=flops / ms / 1e9, step_ms=ms * args.layers,
                       max_diff=max((out.float() - reference[0]).abs().max().item(),
                                    (dq.float() - reference[1]).abs().max().item()))
            rows.append(row)

    print(f"\ncausal attention fwd+bwd, q {b}x{hq}x{t}x{d}, k/v {b}x{hk}x{t}x{d}, bf16, {args.layers} layers\n")
    print("| backend | K/V | ms per layer | TFLOP/s | ms per step | max diff from default |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        kv = "grouped (enable_gqa)" if r["enable_gqa"] else "repeated"
        if "unavailable" in r:
            print(f"| {r['backend']} | {kv} | unavailable: {r['unavailable']} | | | |")
        else:
            print(f"| {r['backend']} | {kv} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['step_ms']:.1f} | "
                  f"{r['max_diff']:.3g} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(shape=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
