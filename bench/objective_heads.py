"""The LM head of a DPO step (bench/TARGETS.md: 4 pairs x 1024 tokens, hidden 4096, vocab 128,256), forward
+ backward from given final hidden states: the torch composition and Liger's chunked DPO loss, each in its
own process, beside Tigon's head (tigon-objective-head-bench, run by deploy/device/all.sh in the same call).
Policy and reference heads both run, as in a DPO step with a reference model.

  python bench/objective_heads.py --provider torch|liger      # time and peak memory
  python bench/objective_heads.py --compare --tigon-bench BIN  # exactness: Tigon and Liger against float64

Rows are (chosen, rejected) pairs: Tigon takes them interleaved (0, 1), (2, 3), ...; Liger stacked (all
chosen, then all rejected), so its inputs are permuted to the same pairs."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from memory import MIB  # noqa: E402

BETA = 0.1


def make_inputs(rows, seq, hidden, vocab, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(rows, seq, hidden, generator=g, device=device).to(torch.bfloat16)
    w = (torch.randn(vocab, hidden, generator=g, device=device) * 0.02).to(torch.bfloat16)
    ref_h = (h.float() + 0.1 * torch.randn(h.shape, generator=g, device=device)).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (rows, seq), generator=g, device=device)
    labels[:, : seq // 4] = -100  # a prompt
    return h, w, ref_h, labels


def token_logprobs(h, w, labels, dtype):
    logits = (h.to(dtype) @ w.to(dtype).t())
    lp = torch.log_softmax(logits.float() if dtype != torch.float64 else logits, -1)
    return lp.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != -100)


def dpo_loss(lp, ref_lp):
    logps, ref = lp.sum(-1), ref_lp.sum(-1)
    h = (logps[0::2] - ref[0::2]) - (logps[1::2] - ref[1::2])
    return -F.logsigmoid(BETA * h).mean()


def torch_step(h, w, ref_h, labels):
    """Hugging Face/TRL's composition: bf16 logits, upcast, log_softmax; the reference without grad."""
    with torch.no_grad():
        ref_lp = token_logprobs(ref_h, w, labels, torch.bfloat16)
    lp = token_logprobs(h, w, labels, torch.bfloat16)
    loss = dpo_loss(lp, ref_lp)
    loss.backward()
    return loss


def stacked(t):
    """Interleaved (chosen, rejected) rows -> Liger's layout: every chosen row, then every rejected one."""
    return torch.cat([t[0::2], t[1::2]])


def liger_step(h, w, ref_h, labels, loss_fn):
    """h, ref_h, labels already in Liger's stacked layout."""
    out = loss_fn(w, h, labels, ref_input=ref_h, ref_weight=w.detach())
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return loss


def time_provider(provider, rows, seq, hidden, vocab, steps):
    h0, w0, ref_h, labels = make_inputs(rows, seq, hidden, vocab)
    if provider == "liger":
        h0, ref_h, labels = stacked(h0), stacked(ref_h), stacked(labels)
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss
        loss_fn = LigerFusedLinearDPOLoss(beta=BETA, use_ref_model=True)
        step = lambda h, w: liger_step(h, w, ref_h, labels, loss_fn)  # noqa: E731
    else:
        step = lambda h, w: torch_step(h, w, ref_h, labels)  # noqa: E731
    times, peak = [], 0.0
    for i in range(steps + 3):
        h = h0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        loss = step(h, w)
        torch.cuda.synchronize()
        if i >= 3:
            times.append(1e3 * (time.perf_counter() - start))
        peak = max(peak, (torch.cuda.max_memory_allocated() - base) / MIB)
        del h, w
    print(f"{provider} dpo head {rows} x {seq}, hidden {hidden}, vocab {vocab}, reference head included: "
          f"{statistics.median(times):.2f} ms (median of {steps}), peak {peak:.0f} MiB above the inputs, "
          f"loss {loss.item():.5f}")


def compare(tigon_bench, rows, seq, hidden, vocab):
    """Loss and gradients of Tigon's and Liger's heads against the float64 composition, same inputs."""
    from safetensors.torch import load_file, save_file
    from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss
    h, w, ref_h, labels = make_inputs(rows, seq, hidden, vocab, seed=1)
    with torch.no_grad():
        ref_lp = token_logprobs(ref_h, w, labels, torch.float64)
    h64 = h.double().requires_grad_(True)
    w64 = w.double().requires_grad_(True)
    exact = dpo_loss(token_logprobs(h64, w64, labels, torch.float64), ref_lp)
    exact.backward()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"hidden": h.cpu().contiguous(), "lm_head": w.cpu().contiguous(), "labels": labels.cpu(),
                   "reference_logprobs": ref_lp.float().cpu()}, inputs)
        subprocess.run([tigon_bench, "--loss", "dpo", "--inputs", inputs, "--outputs", outputs, "--steps", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        out = load_file(outputs)
        results["tigon"] = (out["loss"].item(), out["grad_hidden"], out["grad_lm_head"])
    hl = stacked(h).clone().requires_grad_(True)
    wl = w.clone().requires_grad_(True)
    loss_fn = LigerFusedLinearDPOLoss(beta=BETA, use_ref_model=True)
    loss = liger_step(hl, wl, stacked(ref_h), stacked(labels), loss_fn)
    # Back to interleaved rows for the comparison.
    grad_h = torch.empty_like(hl.grad)
    grad_h[0::2], grad_h[1::2] = hl.grad[: rows // 2], hl.grad[rows // 2:]
    results["liger"] = (loss.item(), grad_h, wl.grad)
    for name, (value, gh, gw) in results.items():
        def rel(a, b):
            return ((a.double().cpu() - b.double().cpu()).abs().max() / b.double().cpu().abs().max()).item()
        print(f"{name} dpo exactness vs float64 ({rows} x {seq}, vocab {vocab}): loss {value:.6f} vs "
              f"{exact.item():.6f}, grad hidden max rel err {rel(gh, h64.grad):.2e}, grad lm_head {rel(gw, w64.grad):.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--provider", choices=["torch", "liger"])
    p.add_argument("--compare", action="store_true")
    p.add_argument("--tigon-bench", default="build/bench/tigon-objective-head-bench")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    if a.compare:
        compare(a.tigon_bench, 4, 256, 1024, 32000)
    else:
        time_provider(a.provider, a.rows, a.seq, a.hidden, a.vocab, a.steps)


if __name__ == "__main__":
    main()
