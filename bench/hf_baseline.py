#!/usr/bin/env python3
"""Hugging Face eager baseline for the end-to-end benchmark (bench/TARGETS.md's method).

One training step = forward, backward, AdamW (fused=True) with parameters, gradients and AdamW state in
bf16, random initialisation, random tokens, SDPA attention, no activation checkpointing. Reports tokens/s
(median step time after warm-up) and peak allocated memory.

    python3 bench/hf_baseline.py --model llama3.2-1b --batch 8 --seq 2048 [--steps 10] [--out result.json]
    python3 bench/hf_baseline.py --model llama3-8b --batch 1 --max-seq   # longest sequence that fits
"""
import argparse
import json
import statistics
import time

import torch
import transformers

from model_configs import MODELS  # noqa: E402


def build(name):
    config = transformers.LlamaConfig(**MODELS[name])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                              dtype=torch.bfloat16)
    model.train()
    return model, config


def step_fn(model, optimizer, batch, seq, vocab):
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.loss
    return step


def measure(name, batch, seq, steps, warmup=2):
    model, config = build(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    step = step_fn(model, optimizer, batch, seq, config.vocab_size)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        loss.item()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    result = dict(model=name, batch=batch, seq=seq, tokens_per_second=batch * seq / median,
                  step_seconds=median, peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                  peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30, loss=float(loss))
    del model, optimizer, step
    torch.cuda.empty_cache()
    return result


def fits(name, seq):
    try:
        measure(name, 1, seq, steps=1, warmup=0)
        return True
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--max-seq", action="store_true", help="search the longest sequence at batch 1")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.max_seq:
        best = 0
        for seq in [8192, 12288, 16384, 20480, 24576, 32768, 40960, 49152]:
            ok = fits(args.model, seq)
            print(f"{args.model} batch 1 seq {seq}: {'fits' if ok else 'out of memory'}", flush=True)
            if not ok:
                break
            best = seq
        result = dict(model=args.model, longest_seq=best)
    else:
        result = measure(args.model, args.batch, args.seq, args.steps)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
