#!/usr/bin/env python3
"""Benchmark of the norm, RoPE and gated-activation kernels at bench/TARGETS.md's shapes (bf16, one H200):

  RMSNorm (Llama casting)    x 8192 x 4096, weight 4096
  add + RMSNorm              x, residual 8192 x 4096 (no TARGETS row; the fused residual add of a decoder)
  LayerNorm                  x 8192 x 4096, weight and bias 4096
  SwiGLU, GeGLU              a, b 8192 x 14336
  RoPE (q and k together)    q 4 x 32 x 2048 x 128, k 4 x 8 x 2048 x 128, cos/sin [4, 2048, 128]

forward + backward (gradient w.r.t. every input that has one), each for Tigon (torch.ops.tigon.*, loaded
from $TIGON_KERNELS_LIB), the Hugging Face eager composition and torch.compile of it. Time:
triton.testing.do_bench median (CUDA events). Peak: device memory allocated during one forward + backward
above what was allocated before it (inputs, weights and the incoming gradient resident). Floor: the bytes
each op must move (read inputs and dy once, write outputs and gradients once) at 4.3 TB/s.
Prints a markdown table last; --out writes JSON.

    TIGON_KERNELS_LIB=build-gpu/kernels/libtigon_kernels.so python3 bench/bench_norm_rope_glu.py --out out/norm_rope_glu.json
"""
import argparse
import gc
import json
import os

import torch
import torch.nn.functional as F
import triton.testing

from device import HBM_BYTES_PER_S, load_tigon
from memory import MIB, peak_mib

DEV = torch.device("cuda")
DTYPE = torch.bfloat16


def floor_ms(nbytes):
    return nbytes / HBM_BYTES_PER_S * 1e3


def measure(rows, op, impl, fn, leaves, floor, goal, warmup, rep):
    try:
        fn()  # compilation / first-call work outside the timing
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=list(leaves), return_mode="median")
        mib = peak_mib(fn, leaves)
        row = dict(op=op, impl=impl, ms=ms, peak_mib=mib, floor_ms=floor, goal=goal, x_floor=ms / floor)
    except (torch.OutOfMemoryError, RuntimeError) as e:  # report, keep going
        row = dict(op=op, impl=impl, ms=None, peak_mib=None, floor_ms=floor, goal=goal, error=str(e)[:300])
    for t in leaves:
        t.grad = None
    gc.collect()
    torch.cuda.empty_cache()
    rows.append(row)
    print(json.dumps(row), flush=True)


# ------------------------------------------------------------------- Hugging Face eager compositions


def hf_llama_rms_norm(x, weight, eps=1e-6):
    """transformers' LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def hf_add_rms_norm(x, residual, weight, eps=1e-6):
    h = x + residual
    return hf_llama_rms_norm(h, weight, eps), h


def hf_layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def hf_swiglu(a, b):
    return F.silu(a) * b


def hf_geglu(a, b):
    return F.gelu(a, approximate="tanh") * b


# ---------------------------------------------------------------------------------------------- cases


def leaf(t):
    return t.detach().requires_grad_(True)


def backward_step(forward, inputs, grads):
    """forward(*inputs) then backward with `grads` (one per output)."""

    def step():
        out = forward(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, grads)

    return step


def cases(tigon):
    """(op, goal, bytes moved, inputs, incoming grads, {impl: forward})."""
    e = 2  # bytes per bf16 element
    n, h = 8192, 4096
    x = leaf(torch.randn(n, h, device=DEV, dtype=DTYPE))
    w = leaf(1 + 0.1 * torch.randn(h, device=DEV, dtype=DTYPE))
    dy = torch.randn(n, h, device=DEV, dtype=DTYPE)
    # forward reads x, writes y; backward reads x and dy, writes dx (weight-sized traffic is negligible)
    yield ("RMSNorm (Llama casting) x 8192x4096", "<= 0.16 ms, <= 130 MiB", 5 * n * h * e, (x, w), (dy,), {
        "tigon": lambda x, w: tigon.rms_norm(x, w, 1e-6, 0.0, 0),
        "hf_eager": hf_llama_rms_norm,
        "torch_compile": torch.compile(hf_llama_rms_norm),
    })

    r = leaf(torch.randn(n, h, device=DEV, dtype=DTYPE))
    dres = torch.randn(n, h, device=DEV, dtype=DTYPE)
    # forward reads x, residual, writes y, residual_out; backward reads h, dy, d_residual_out, writes dx (= dr)
    yield ("add + RMSNorm x, residual 8192x4096", "-", 8 * n * h * e, (x, r, w), (dy, dres), {
        "tigon": lambda x, r, w: tuple(tigon.add_rms_norm(x, r, w, 1e-6, 0.0, 0)),
        "hf_eager": hf_add_rms_norm,
        "torch_compile": torch.compile(hf_add_rms_norm),
    })

    b = leaf(0.1 * torch.randn(h, device=DEV, dtype=DTYPE))
    yield ("LayerNorm x 8192x4096", "<= 0.16 ms, <= 130 MiB", 5 * n * h * e, (x, w, b), (dy,), {
        "tigon": lambda x, w, b: tigon.layer_norm(x, w, b, 1e-5),
        "hf_eager": hf_layer_norm,
        "torch_compile": torch.compile(hf_layer_norm),
    })
    del x, r, dy, dres

    rows, inter = 8192, 14336
    a = leaf(torch.randn(rows, inter, device=DEV, dtype=DTYPE))
    bb = leaf(torch.randn(rows, inter, device=DEV, dtype=DTYPE))
    dy = torch.randn(rows, inter, device=DEV, dtype=DTYPE)
    # forward reads a, b, writes y; backward reads dy, a, b, writes da, db
    glu_bytes = 8 * rows * inter * e
    yield ("SwiGLU a, b 8192x14336", "<= 0.42 ms, <= 224 MiB", glu_bytes, (a, bb), (dy,), {
        "tigon": lambda a, b: tigon.swiglu(a, b),
        "hf_eager": hf_swiglu,
        "torch_compile": torch.compile(hf_swiglu),
    })
    yield ("GeGLU a, b 8192x14336", "<= 0.42 ms, <= 224 MiB", glu_bytes, (a, bb), (dy,), {
        "tigon": lambda a, b: tigon.geglu(a, b),
        "hf_eager": hf_geglu,
        "torch_compile": torch.compile(hf_geglu),
    })
    del a, bb, dy

    batch, hq, hk, seq, dim = 4, 32, 8, 2048, 128
    q = leaf(torch.randn(batch, hq, seq, dim, device=DEV, dtype=DTYPE))
    k = leaf(torch.randn(batch, hk, seq, dim, device=DEV, dtype=DTYPE))
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, device=DEV, dtype=torch.float32) / dim))
    pos = torch.arange(seq, device=DEV, dtype=torch.float32)
    emb = torch.cat([torch.outer(pos, inv_freq)] * 2, dim=-1).expand(batch, seq, dim)
    cos, sin = emb.cos().to(DTYPE).contiguous(), emb.sin().to(DTYPE).contiguous()  # LlamaRotaryEmbedding's
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    # forward reads q, k, writes q', k'; backward reads dq', dk', writes dq, dk (cos/sin are small)
    yield ("RoPE q 4x32x2048x128, k 4x8x2048x128", "<= 0.16 ms, <= 160 MiB",
           4 * (q.numel() + k.numel()) * e, (q, k, cos, sin), (dq, dk), {
               "tigon": lambda q, k, c, s: tuple(tigon.rope(q, k, c, s)),
               "hf_eager": hf_rope,
               "torch_compile": torch.compile(hf_rope),
           })


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--warmup", type=int, default=50, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=int, default=400, help="do_bench repetitions, ms")
    parser.add_argument("--impl", action="append", help="only these implementations (tigon, hf_eager, torch_compile)")
    args = parser.parse_args()
    tigon = load_tigon()
    torch.manual_seed(0)
    rows = []
    for op, goal, nbytes, inputs, grads, impls in cases(tigon):
        leaves = [t for t in inputs if t.requires_grad]
        for impl, forward in impls.items():
            if args.impl and impl not in args.impl:
                continue
            measure(rows, op, impl, backward_step(forward, inputs, grads), leaves, floor_ms(nbytes), goal, args.warmup,
                    args.rep)

    by_op = {}
    for row in rows:
        by_op.setdefault(row["op"], {})[row["impl"]] = row
    for row in rows:
        peers = by_op[row["op"]]
        for peer in ("hf_eager", "torch_compile"):
            if row.get("ms") and peers.get(peer, {}).get("ms"):
                row[f"speedup_vs_{peer}"] = peers[peer]["ms"] / row["ms"]

    print("\n| op | impl | ms | peak MiB | floor ms | x floor | vs HF eager | vs torch.compile | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if row.get("ms") is None:
            print(f"| {row['op']} | {row['impl']} | error | | {row['floor_ms']:.3f} | | | | {row['goal']} |")
            continue
        vs_hf = row.get("speedup_vs_hf_eager")
        vs_tc = row.get("speedup_vs_torch_compile")
        print(f"| {row['op']} | {row['impl']} | {row['ms']:.3f} | {row['peak_mib']:.0f} | {row['floor_ms']:.3f} | "
              f"{row['x_floor']:.2f} | {'' if vs_hf is None else f'{vs_hf:.2f}x'} | "
              f"{'' if vs_tc is None else f'{vs_tc:.2f}x'} | {row['goal']} |")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
