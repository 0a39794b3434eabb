#!/usr/bin/env python3
"""Benchmark of the loss and optimizer kernels at bench/TARGETS.md's shapes (bf16, one H200):

  CrossEntropy on logits 8192 x 128256          forward + backward (gradient w.r.t. the logits)
  Fused linear + CE, h 8192 x 4096, W 128256 x 4096   forward + backward (gradients w.r.t. h and W),
                                                 over several chunk sizes to choose one by measurement
  AdamW over a 1.2e9-element flat buffer         bf16 everything, and fp32 master + bf16 grads + bf16 copy

each for Tigon (torch.ops.tigon.*, loaded from $TIGON_KERNELS_LIB), the Hugging Face eager composition and
torch.compile of it (AdamW: torch.optim.AdamW(fused=True)). Time: triton.testing.do_bench median (CUDA
events). Peak: device memory allocated during one call above what was allocated before it (inputs
resident). Floors: bytes / 4.3 TB/s or FLOPs / 790 TFLOP/s. Prints a markdown table last; --out writes JSON.

    TIGON_KERNELS_LIB=build-gpu/kernels/libtigon_kernels.so python3 bench/bench_ce_flce_adamw.py --out out/ce.json
"""
import argparse
import gc
import json
import os

import torch
import torch.nn.functional as F
import triton.testing

from device import BF16_FLOPS_PER_S, HBM_BYTES_PER_S, load_tigon
from memory import MIB, peak_mib



def bench_ms(fn, grad_to_none=(), warmup=50, rep=400):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=list(grad_to_none), return_mode="median")


def measure(rows, op, impl, fn, grad_to_none, floor_ms, goal, warmup=50, rep=400, extra=None):
    try:
        fn()  # warm-up / compilation outside the timing
        torch.cuda.synchronize()
        ms = bench_ms(fn, grad_to_none, warmup, rep)
        mib = peak_mib(fn, grad_to_none)
        row = dict(op=op, impl=impl, ms=ms, peak_mib=mib, floor_ms=floor_ms, goal=goal, x_floor=ms / floor_ms)
    except torch.OutOfMemoryError as e:  # report, keep going
        row = dict(op=op, impl=impl, ms=None, peak_mib=None, floor_ms=floor_ms, goal=goal, error=str(e)[:200])
    if extra:
        row.update(extra)
    for t in grad_to_none:
        t.grad = None
    gc.collect()
    torch.cuda.empty_cache()
    rows.append(row)
    print(json.dumps(row), flush=True)


# ------------------------------------------------------------------------------------------ cross entropy


def hf_cross_entropy(logits, target):
    # transformers' ForCausalLMLoss after the shift: upcast, then torch's cross entropy (mean, ignore -100).
    return F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="mean")


def bench_cross_entropy(tigon, rows, n=8192, vocab=128256):
    op = f"CrossEntropy {n}x{vocab}"
    floor_ms = 3 * n * vocab * 2 / HBM_BYTES_PER_S * 1e3  # read twice (softmax, gradient), write once
    goal = "<= 1.7 ms, <= 1 MiB"
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(n, vocab, device="cuda", generator=g) * 3).bfloat16()
    target = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    target[torch.rand(n, device="cuda", generator=g) < 0.1] = -100

    # Sanity: same loss as the eager composition (fp32 math on the same bf16 values on both sides).
    with torch.no_grad():
        ref = hf_cross_entropy(logits, target).item()
        got = tigon.cross_entropy(logits.clone(), target).item()
    print(f"# CE loss tigon {got:.6f} vs eager {ref:.6f}", flush=True)

    x = logits.clone().requires_grad_(True)

    def tigon_fn():  # overwrites x with its gradient each call; the values stay finite and the work is the same
        tigon.cross_entropy(x, target).backward()
    measure(rows, op, "tigon", tigon_fn, [x], floor_ms, goal, extra=dict(loss_rel_diff=abs(got - ref) / abs(ref)))
    del x

    x = logits.clone().requires_grad_(True)

    def eager_fn():
        hf_cross_entropy(x, target).backward()
    measure(rows, op, "hf eager", eager_fn, [x], floor_ms, goal)

    compiled = torch.compile(hf_cross_entropy)

    def compiled_fn():
        compiled(x, target).backward()
    measure(rows, op, "torch.compile", compiled_fn, [x], floor_ms, goal)
    del x, logits


# ------------------------------------------------------------------------------ fused linear cross entropy


def hf_linear_cross_entropy(hidden, weight, target):
    return hf_cross_entropy(hidden @ weight.t(), target)  # lm_head in bf16, then the upcast loss


def default_chunk(n, vocab, element_size=2, budget=256 * MIB, multiple=64):
    """kernels/ops/fused_linear_cross_entropy.cpp's DefaultFusedLinearCrossEntropyChunk, for the label."""
    if n <= 1:
        return 1
    max_rows = max(budget // (vocab * element_size), 1)
    n_chunks = -(-n // max_rows)
    chunk = -(-n // n_chunks)
    rounded = -(-chunk // multiple) * multiple
    return min(rounded if rounded <= max_rows else chunk, n)


def bench_flce(tigon, rows, n=8192, h=4096, vocab=128256, chunks=(256, 512, 1024, 2048, 0)):
    op = f"Fused linear + CE h {n}x{h}, W {vocab}x{h}"
    floor_ms = 3 * 2 * n * vocab * h / BF16_FLOPS_PER_S * 1e3  # logits, grad_h, grad_W GEMMs
    goal = "<= 38 ms, <= 1536 MiB"
    g = torch.Generator(device="cuda").manual_seed(1)
    hidden = torch.randn(n, h, device="cuda", generator=g).bfloat16().requires_grad_(True)
    weight = (torch.randn(vocab, h, device="cuda", generator=g) * (1 / h**0.5)).bfloat16().requires_grad_(True)
    target = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    target[torch.rand(n, device="cuda", generator=g) < 0.1] = -100

    with torch.no_grad():
        ref = hf_linear_cross_entropy(hidden, weight, target).item()
    paper_chunk = 2 ** (-(-n // -(-vocab // h)) - 1).bit_length()  # 2^ceil(log2(ceil(N / ceil(V / H))))
    for chunk in chunks:
        with torch.no_grad():
            got = tigon.fused_linear_cross_entropy(hidden, weight, None, target, None, -100, "mean", 0.0, 0.0, 0.0,
                                                   chunk).item()
        label = f"tigon chunk={chunk}" + (" (paper formula)" if chunk == paper_chunk else "")
        if chunk == 0:
            label = f"tigon chunk=default ({default_chunk(n, vocab)})"

        def tigon_fn(chunk=chunk):
            tigon.fused_linear_cross_entropy(hidden, weight, None, target, None, -100, "mean", 0.0, 0.0, 0.0,
                                             chunk).backward()
        measure(rows, op, label, tigon_fn, [hidden, weight], floor_ms, goal, warmup=200, rep=2000,
                extra=dict(chunk=chunk, loss_rel_diff=abs(got - ref) / abs(ref)))

    def eager_fn():
        hf_linear_cross_entropy(hidden, weight, target).backward()
    measure(rows, op, "hf eager", eager_fn, [hidden, weight], floor_ms, goal, warmup=200, rep=2000)

    compiled = torch.compile(hf_linear_cross_entropy)

    def compiled_fn():
        compiled(hidden, weight, target).backward()
    measure(rows, op, "torch.compile", compiled_fn, [hidden, weight], floor_ms, goal, warmup=200, rep=2000)
    del hidden, weight


# ----------------------------------------------------------------------------------------------------- adamw


def bench_adamw(tigon, rows, n=1_200_000_000):
    hp = dict(lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    goal = "bandwidth floor"

    # bf16 policy: param, grad, exp_avg, exp_avg_sq all bf16 (read 4 x 2 B, write 3 x 2 B per element).
    op = f"AdamW bf16 flat {n / 1e9:.1f}e9"
    floor_ms = n * 14 / HBM_BYTES_PER_S * 1e3
    param = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.01
    m = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
    step = [0]

    def tigon_fn():
        step[0] += 1
        tigon.adamw_step(param, grad, m, v, hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"],
                         step[0], 1.0, None)
    measure(rows, op, "tigon", tigon_fn, [], floor_ms, goal, warmup=100, rep=1000)
    del m, v
    ref = torch.nn.Parameter(param)
    ref.grad = grad
    opt = torch.optim.AdamW([ref], fused=True, **hp)
    measure(rows, op, "torch.optim.AdamW(fused=True)", opt.step, [], floor_ms, goal, warmup=100, rep=1000)
    del opt, ref, param, grad
    gc.collect()
    torch.cuda.empty_cache()

    # bf16_mixed: fp32 master + fp32 state, bf16 grads, bf16 model copy (read 4+2+4+4 B, write 4+4+4+2 B).
    op = f"AdamW fp32 master + bf16 copy {n / 1e9:.1f}e9"
    floor_ms = n * 28 / HBM_BYTES_PER_S * 1e3
    master = torch.randn(n, device="cuda", dtype=torch.float32)
    grad = (torch.randn(n, device="cuda", dtype=torch.float32) * 0.01).bfloat16()
    m = torch.zeros(n, device="cuda", dtype=torch.float32)
    v = torch.zeros(n, device="cuda", dtype=torch.float32)
    copy = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    step[0] = 0

    def tigon_mixed():
        step[0] += 1
        tigon.adamw_step(master, grad, m, v, hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"],
                         hp["weight_decay"], step[0], 1.0, copy)
    measure(rows, op, "tigon", tigon_mixed, [], floor_ms, goal, warmup=100, rep=1000)
    del m, v
    ref = torch.nn.Parameter(master)
    opt = torch.optim.AdamW([ref], fused=True, **hp)

    def torch_mixed():  # what the same policy costs with torch: upcast the grads, fused step, copy back
        ref.grad = grad.float()
        opt.step()
        copy.copy_(ref.detach())
    measure(rows, op, "torch.optim.AdamW(fused=True) + casts", torch_mixed, [], floor_ms, goal, warmup=100, rep=1000)
    del opt, ref, master, grad, copy
    gc.collect()
    torch.cuda.empty_cache()


def table(rows):
    lines = ["| op | implementation | ms | peak MiB | floor ms | x floor | goal |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ms = f"{r['ms']:.3f}" if r.get("ms") is not None else "OOM"
        mib = f"{r['peak_mib']:.1f}" if r.get("peak_mib") is not None else "-"
        xf = f"{r['x_floor']:.2f}" if r.get("x_floor") is not None else "-"
        lines.append(f"| {r['op']} | {r['impl']} | {ms} | {mib} | {r['floor_ms']:.3f} | {xf} | {r['goal']} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--only", choices=["ce", "flce", "adamw"], action="append", help="run only these (repeatable)")
    parser.add_argument("--adamw-elements", type=int, default=1_200_000_000)
    args = parser.parse_args()
    tigon = load_tigon()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    only = set(args.only or ["ce", "flce", "adamw"])
    if "ce" in only:
        bench_cross_entropy(tigon, rows)
    if "flce" in only:
        bench_flce(tigon, rows)
    if "adamw" in only:
        bench_adamw(tigon, rows, args.adamw_elements)
    tigon_flce = [r for r in rows if r["op"].startswith("Fused") and r["impl"].startswith("tigon") and r.get("ms")]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)
    if tigon_flce:
        best = min(tigon_flce, key=lambda r: r["ms"])
        result["flce_best_chunk"] = best["chunk"]
        print(f"# FLCE fastest chunk: {best['chunk'] or 'default'} ({best['ms']:.2f} ms, {best['peak_mib']:.0f} MiB)")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
