"""GPU suite for the loss and optimizer kernels: torch.ops.tigon.cross_entropy,
fused_linear_cross_entropy and adamw_step (CUDA path) against their references in float64 and against
torch.optim.AdamW.

Run on the GPU machine (CUDA LibTorch build of libtigon_kernels.so):
    TIGON_KERNELS_LIB=build-gpu/kernels/libtigon_kernels.so /opt/torch/.venv/bin/python3 -m pytest -q tests/gpu/kernels/test_ce_flce_adamw.py

The fused cross entropy overwrites its logits with their gradient, so every call gets a fresh copy.
Tolerances (each stated where used) follow from where the kernels round: fp32 accumulation over V terms,
one rounding of the gradient to the input dtype, and for FLCE the bf16 logits of the chunk matmul and the
bf16 grad_W accumulator.
"""

import gc
import math

import pytest
import torch
import torch.nn.functional as F

# conftest.py has loaded the CUDA build of torch.ops.tigon.
DEV = torch.device("cuda")
tigon = torch.ops.tigon
IGNORE = -100


# ----------------------------------------------------------------------------------------------- helpers


def reference_ce(logits, target, token_weights=None, ignore_index=IGNORE, reduction="mean", label_smoothing=0.0,
                 z_loss_scale=0.0, softcap=0.0):
    """The Hugging Face composition (kernels/reference/cross_entropy.cpp), in float64."""
    x = logits.double()
    if softcap > 0:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(x, target, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing)
    valid = target != ignore_index
    if z_loss_scale != 0:
        lse = torch.logsumexp(x, -1)
        loss = loss + torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    if token_weights is not None:
        loss = loss * token_weights.double()
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum().clamp_min(1)


def make_ce_inputs(n, vocab, dtype, seed, ignored=0.2):
    g = torch.Generator(device=DEV).manual_seed(seed)
    logits = (torch.randn(n, vocab, device=DEV, generator=g) * 3).to(dtype)
    target = torch.randint(0, vocab, (n,), device=DEV, generator=g)
    target[torch.rand(n, device=DEV, generator=g) < ignored] = IGNORE
    weights = torch.rand(n, device=DEV, generator=g) + 0.5
    return logits, target, weights


def upstream_for(reduction, n, seed=0):
    if reduction == "none":
        return torch.rand(n, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed)) + 0.5
    return torch.ones((), device=DEV)


def assert_close(actual, expected, rtol, atol_frac, what):
    """|a - e| <= rtol * |e| + atol_frac * max|e|, elementwise, in float64."""
    a, e = actual.double(), expected.double()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(e.shape)}"
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    scale = e.abs().max().item() if e.numel() else 0.0
    err = (a - e).abs()
    bound = rtol * e.abs() + atol_frac * scale
    worst = (err - bound).max().item() if e.numel() else -1.0
    assert worst <= 0, f"{what}: max abs error {err.max().item():.3e} (max |expected| {scale:.3e})"


def poison_allocator(mib=1024):
    """Fill and free a large block, so the caching allocator hands NaN-filled memory to the next call."""
    block = torch.full((mib * 1024 * 1024 // 4,), float("nan"), device=DEV)
    del block


# Rounding of the gradient to its dtype (relative half-ulp: bf16 2^-9, fp16 2^-11) on top of fp32 arithmetic.
# fp32: the fp32 sum over V terms puts a relative error of up to ~1e-5 on lse, which shifts every probability
# by that much; 1e-4 leaves margin at V = 256000. The absolute floor covers entries that are small
# differences of larger terms (label smoothing, the target's -1).
GRAD_TOL = {torch.float32: (1e-4, 1e-6), torch.bfloat16: (8e-3, 2e-3), torch.float16: (2e-3, 5e-4)}
# The loss is computed in fp32 from exactly the values the reference upcasts: only fp32 sums over V terms.
LOSS_TOL = (2e-5, 1e-6)


def run_ce_case(n, vocab, dtype, reduction="mean", label_smoothing=0.0, z_loss_scale=0.0, softcap=0.0,
                weighted=False, seed=0, ignored=0.2):
    logits, target, weights = make_ce_inputs(n, vocab, dtype, seed, ignored)
    tw = weights if weighted else None
    up = upstream_for(reduction, n, seed)
    x_ref = logits.double().requires_grad_(True)
    loss_ref = reference_ce(x_ref, target, tw, IGNORE, reduction, label_smoothing, z_loss_scale, softcap)
    loss_ref.backward(up.double())
    x = logits.clone().requires_grad_(True)
    poison_allocator(256)
    loss = tigon.cross_entropy(x, target, tw, IGNORE, reduction, label_smoothing, z_loss_scale, softcap)
    loss.backward(up.to(loss.dtype))
    torch.cuda.synchronize()
    assert loss.dtype == torch.float32
    assert x.grad.dtype == dtype
    what = f"n={n} V={vocab} {dtype} {reduction} ls={label_smoothing} z={z_loss_scale} cap={softcap} w={weighted}"
    assert_close(loss, loss_ref, *LOSS_TOL, "loss " + what)
    assert_close(x.grad, x_ref.grad, *GRAD_TOL[dtype], "grad " + what)


# ------------------------------------------------------------------------------------------ cross_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,vocab", [(64, 32000), (16, 256000), (37, 1001), (1, 128256), (130, 50257)])
def test_ce_shapes_and_dtypes(n, vocab, dtype):
    run_ce_case(n, vocab, dtype, seed=n + vocab)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls,z,cap,weighted", [
    (0.0, 0.0, 0.0, False), (0.1, 0.0, 0.0, False), (0.0, 1e-4, 0.0, False), (0.0, 0.0, 30.0, False),
    (0.0, 0.0, 0.0, True), (0.1, 1e-4, 30.0, True)])
def test_ce_options(reduction, ls, z, cap, weighted):
    run_ce_case(48, 32000, torch.bfloat16, reduction, ls, z, cap, weighted, seed=7)
    run_ce_case(19, 4097, torch.float32, reduction, ls, z, cap, weighted, seed=8)


def test_ce_all_ignored_rows_give_zero():
    logits, target, _ = make_ce_inputs(8, 32000, torch.bfloat16, 3)
    target.fill_(IGNORE)
    for reduction in ["mean", "sum", "none"]:
        x = logits.clone().requires_grad_(True)
        loss = tigon.cross_entropy(x, target, None, IGNORE, reduction, 0.1, 1e-4, 0.0)
        loss.backward(torch.ones_like(loss))
        assert loss.abs().max().item() == 0.0
        assert x.grad.abs().max().item() == 0.0


def test_ce_scalar_upstream_other_than_one():
    logits, target, _ = make_ce_inputs(32, 32000, torch.float32, 4)
    x_ref = logits.double().requires_grad_(True)
    (reference_ce(x_ref, target) * 3.5).backward()
    x = logits.clone().requires_grad_(True)
    (tigon.cross_entropy(x, target) * 3.5).backward()
    assert_close(x.grad, x_ref.grad, *GRAD_TOL[torch.float32], "grad x3.5")


def test_ce_non_contiguous_logits():
    n, vocab = 33, 32003
    logits, target, _ = make_ce_inputs(n, vocab, torch.bfloat16, 5)
    x_ref = logits.double().requires_grad_(True)
    reference_ce(x_ref, target, label_smoothing=0.1).backward()
    # Rows of a wider buffer (odd row stride, unaligned rows: the scalar path): written in place, padding kept.
    wide = torch.randn(n, vocab + 3, device=DEV).to(torch.bfloat16)
    wide[:, :vocab] = logits
    pad = wide[:, vocab:].clone()
    x = wide[:, :vocab].detach().requires_grad_(True)
    tigon.cross_entropy(x, target, None, IGNORE, "mean", 0.1).backward()
    assert_close(x.grad, x_ref.grad, *GRAD_TOL[torch.bfloat16], "row-strided grad")
    assert torch.equal(wide[:, vocab:], pad), "wrote outside the view"
    # Vocabulary-strided (column-major): goes through a contiguous copy.
    x2 = logits.t().contiguous().t().detach().requires_grad_(True)
    tigon.cross_entropy(x2, target, None, IGNORE, "mean", 0.1).backward()
    assert_close(x2.grad, x_ref.grad, *GRAD_TOL[torch.bfloat16], "column-major grad")


def test_ce_deterministic_and_leaves_logits_alone_without_grad():
    logits, target, _ = make_ce_inputs(64, 32000, torch.bfloat16, 6)
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    la, lb = tigon.cross_entropy(a, target), tigon.cross_entropy(b, target)
    la.backward()
    lb.backward()
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad)
    x = logits.clone()
    with torch.no_grad():
        loss = tigon.cross_entropy(x, target)
    assert torch.equal(x, logits)
    assert_close(loss, reference_ce(logits, target), *LOSS_TOL, "no-grad loss")


def test_ce_out_of_range_target_gives_nan_loss():
    logits, target, _ = make_ce_inputs(4, 1000, torch.float32, 7, ignored=0.0)
    target[1] = 1000
    loss = tigon.cross_entropy(logits.clone(), target, None, IGNORE, "none")
    assert math.isnan(loss[1].item()) and torch.isfinite(loss[[0, 2, 3]]).all()


def test_ce_extra_memory_is_negligible():
    """Goal (bench/TARGETS.md): <= 1 MiB above the resident logits for forward + backward."""
    logits, target, _ = make_ce_inputs(4096, 128256, torch.bfloat16, 8)
    x = logits.requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tigon.cross_entropy(x, target).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= 1 << 20, f"{extra / 2**20:.2f} MiB extra"


def test_ce_beyond_2_pow_31_elements():
    """16800 x 128256 bf16 = 2.15e9 elements: row offsets overflow int32 from row 16744 on. The loss is
    checked against the reference over all rows (computed in float64 by chunks before the call), the
    gradient on sampled rows on both sides of the 2^31 boundary."""
    n, vocab = 16800, 128256
    assert n * vocab > 2**31
    logits, target, _ = make_ce_inputs(n, vocab, torch.bfloat16, 9, ignored=0.1)
    rows = torch.tensor([0, 1, 8191, 16742, 16743, 16744, 16745, n - 2, n - 1], device=DEV)
    target[rows] = torch.tensor([0, vocab - 1, 5, vocab - 1, 0, vocab - 1, 12345, 7, vocab - 1], device=DEV)
    n_valid = (target != IGNORE).sum().item()
    per_row = torch.cat([reference_ce(logits[i:i + 1024], target[i:i + 1024], reduction="none")
                         for i in range(0, n, 1024)])
    ref_loss = per_row.sum() / n_valid
    x_rows = logits[rows].double().requires_grad_(True)
    (reference_ce(x_rows, target[rows], reduction="sum") / n_valid).backward()
    x = logits.requires_grad_(True)
    loss = tigon.cross_entropy(x, target)
    loss.backward()
    assert_close(loss, ref_loss, *LOSS_TOL, "loss over 2^31 elements")
    assert_close(x.grad[rows], x_rows.grad, *GRAD_TOL[torch.bfloat16], "gradient rows around 2^31")
    del x, logits
    gc.collect()
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ fused_linear_cross_entropy


def make_flce_inputs(n, h, vocab, dtype, seed, ignored=0.2):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(n, h, device=DEV, generator=g).to(dtype)
    weight = (torch.randn(vocab, h, device=DEV, generator=g) * (2.0 / math.sqrt(h))).to(dtype)
    bias = (torch.randn(vocab, device=DEV, generator=g) * 0.5).to(dtype)
    target = torch.randint(0, vocab, (n,), device=DEV, generator=g)
    target[torch.rand(n, device=DEV, generator=g) < ignored] = IGNORE
    weights = torch.rand(n, device=DEV, generator=g) + 0.5
    return hidden, weight, bias, target, weights


def rel_err(a, e):
    a, e = a.double(), e.double()
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


# fp32: cuBLAS fp32 GEMMs (no TF32 by default) and fp32 CE, 1e-4 relative in norm. bf16/fp16: the chunk's
# logits are rounded to 16 bits before the CE (like the Hugging Face path), grad_h is one 16-bit GEMM
# output and grad_W a 16-bit accumulator rounded once per chunk: 2e-2 relative in norm.
FLCE_REL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


def run_flce_case(n, h, vocab, dtype, chunk, reduction="mean", use_bias=True, weighted=False, ls=0.0, z=0.0, cap=0.0,
                  seed=0, noncontig=False):
    hidden, weight, bias, target, weights = make_flce_inputs(n, h, vocab, dtype, seed)
    tw = weights if weighted else None
    up = upstream_for(reduction, n, seed)
    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    b64 = bias.double().requires_grad_(True) if use_bias else None
    logits64 = h64 @ w64.t() + (b64 if use_bias else 0)
    loss_ref = reference_ce(logits64, target, tw, IGNORE, reduction, ls, z, cap)
    loss_ref.backward(up.double())

    if noncontig:
        hid = hidden.t().contiguous().t()
        wt = weight.t().contiguous().t()
    else:
        hid, wt = hidden.clone(), weight.clone()
    hid.requires_grad_(True)
    wt.requires_grad_(True)
    b = bias.clone().requires_grad_(True) if use_bias else None
    poison_allocator(512)
    loss = tigon.fused_linear_cross_entropy(hid, wt, b, target, tw, IGNORE, reduction, ls, z, cap, chunk)
    loss.backward(up.to(loss.dtype))
    torch.cuda.synchronize()
    what = f"n={n} H={h} V={vocab} {dtype} chunk={chunk} {reduction} bias={use_bias}"
    tol = FLCE_REL[dtype]
    assert rel_err(loss, loss_ref) <= tol, f"loss {what}: {rel_err(loss, loss_ref):.2e}"
    assert rel_err(hid.grad, h64.grad) <= tol, f"grad_hidden {what}: {rel_err(hid.grad, h64.grad):.2e}"
    assert rel_err(wt.grad, w64.grad) <= tol, f"grad_weight {what}: {rel_err(wt.grad, w64.grad):.2e}"
    if use_bias:
        assert rel_err(b.grad, b64.grad) <= tol, f"grad_bias {what}: {rel_err(b.grad, b64.grad):.2e}"
    for g in [hid.grad, wt.grad] + ([b.grad] if use_bias else []):
        assert torch.isfinite(g).all(), f"non-finite gradient {what}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,h,vocab,chunk", [(256, 512, 32000, 0), (256, 512, 32000, 64), (200, 256, 256000, 0),
                                             (33, 64, 1001, 7), (1, 128, 5000, 0)])
def test_flce_shapes(n, h, vocab, chunk, dtype):
    run_flce_case(n, h, vocab, dtype, chunk, seed=n + vocab)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_flce_options(reduction):
    run_flce_case(96, 128, 32000, torch.bfloat16, 32, reduction, use_bias=True, weighted=True, ls=0.1, z=1e-4,
                  cap=30.0, seed=11)
    run_flce_case(50, 64, 3001, torch.float32, 16, reduction, use_bias=False, weighted=False, seed=12)


def test_flce_non_contiguous_and_chunking_invariance():
    run_flce_case(70, 96, 5003, torch.float32, 9, noncontig=True, seed=13)
    hidden, weight, bias, target, _ = make_flce_inputs(128, 64, 4000, torch.float32, 14)
    losses = []
    for chunk in [1, 17, 128, 0]:
        h = hidden.clone().requires_grad_(True)
        losses.append(tigon.fused_linear_cross_entropy(h, weight, bias, target, None, IGNORE, "mean", 0.0, 0.0, 0.0,
                                                       chunk))
    for l in losses[1:]:
        assert_close(l, losses[0], 1e-6, 0, "loss across chunk sizes")


def test_flce_frozen_weight():
    hidden, weight, _, target, _ = make_flce_inputs(64, 128, 8000, torch.bfloat16, 15)
    h = hidden.clone().requires_grad_(True)
    tigon.fused_linear_cross_entropy(h, weight, None, target).backward()
    assert weight.grad is None and h.grad is not None and torch.isfinite(h.grad).all()


def test_flce_llama3_head_memory():
    """Llama-3-8B head at 8192 tokens: peak above the resident inputs must stay within the 1536 MiB goal
    (grad_W 1002 MiB + grad_h 64 MiB + one logits chunk)."""
    hidden, weight, _, target, _ = make_flce_inputs(8192, 4096, 128256, torch.bfloat16, 16)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = tigon.fused_linear_cross_entropy(hidden, weight, None, target)
    loss.backward()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    assert torch.isfinite(loss) and torch.isfinite(weight.grad).all()
    assert extra <= 1536, f"{extra:.0f} MiB above the inputs"


# ------------------------------------------------------------------------------------------------- adamw


def adamw_buffers(n, param_dtype, state_dtype, seed, offset=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    param = torch.randn(n + offset, device=DEV, generator=g).to(param_dtype)[offset:]
    m = torch.zeros(n + offset, device=DEV, dtype=state_dtype)[offset:]
    v = torch.zeros(n + offset, device=DEV, dtype=state_dtype)[offset:]
    return param, m, v


HP = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def tigon_adamw(param, grad, m, v, step, copy=None):
    tigon.adamw_step(param, grad, m, v, HP["lr"], HP["betas"][0], HP["betas"][1], HP["eps"], HP["weight_decay"],
                     step, 1.0, copy)


@pytest.mark.parametrize("n,offset", [(10_000_003, 0), (4097, 1), (8, 0)])
def test_adamw_fp32_matches_torch_optim(n, offset):
    """fp32: same op order as torch.optim.AdamW's single-tensor path; torch's own kernels may contract
    addcdiv into an FMA differently, so parameters may differ by a few ulp after 5 steps (rtol 1e-6)."""
    param, m, v = adamw_buffers(n, torch.float32, torch.float32, 20, offset)
    ref = torch.nn.Parameter(param.clone())
    opt = torch.optim.AdamW([ref], foreach=False, **HP)
    poison_allocator(256)
    for step in range(1, 6):
        grad = torch.randn(n, device=DEV) * 0.1
        ref.grad = grad.clone()
        opt.step()
        tigon_adamw(param, grad, m, v, step)
    torch.cuda.synchronize()
    state = opt.state[ref]
    assert_close(param, ref.detach(), 1e-6, 1e-7, "param")
    assert_close(m, state["exp_avg"], 1e-6, 1e-7, "exp_avg")
    assert_close(v, state["exp_avg_sq"], 1e-6, 1e-7, "exp_avg_sq")


def test_adamw_bf16_matches_fused_torch_adamw():
    """The anchor setting (bf16 params, grads and state, torch.optim.AdamW(fused=True)): both do fp32 math
    and round to bf16 once per step; their formulas round differently in fp32, so a bf16 result may
    differ by one bf16 ulp (2^-8 relative) and drift a little over 3 steps."""
    n = 1_000_003
    param, m, v = adamw_buffers(n, torch.bfloat16, torch.bfloat16, 21)
    ref = torch.nn.Parameter(param.clone())
    opt = torch.optim.AdamW([ref], fused=True, **HP)
    for step in range(1, 4):
        grad = (torch.randn(n, device=DEV) * 0.1).bfloat16()
        ref.grad = grad.clone()
        opt.step()
        tigon_adamw(param, grad, m, v, step)
    torch.cuda.synchronize()
    assert_close(param, ref.detach(), 2**-7, 1e-3, "bf16 param")
    assert (param == ref.detach()).float().mean().item() > 0.99, "more than 1% of bf16 params differ"


def test_adamw_fp32_master_bf16_grads_and_copy_vs_float64():
    """bf16_mixed: fp32 master and state, bf16 gradients, bf16 copy of the master. Oracle: AdamW written out
    in float64 on the same gradients (fp32 rounding over 4 steps: 1e-5 relative)."""
    n = 3_000_001
    param, m, v = adamw_buffers(n, torch.float32, torch.float32, 22)
    copy = torch.empty(n, device=DEV, dtype=torch.bfloat16)
    p64, m64, v64 = param.double(), torch.zeros(n, device=DEV, dtype=torch.float64), torch.zeros(n, device=DEV,
                                                                                               dtype=torch.float64)
    b1, b2 = HP["betas"]
    for step in range(1, 5):
        grad = (torch.randn(n, device=DEV) * 0.1).bfloat16()
        tigon_adamw(param, grad, m, v, step, copy)
        g = grad.double()
        p64 = p64 * (1 - HP["lr"] * HP["weight_decay"])
        m64 = b1 * m64 + (1 - b1) * g
        v64 = b2 * v64 + (1 - b2) * g * g
        p64 = p64 - HP["lr"] * (m64 / (1 - b1**step)) / ((v64 / (1 - b2**step)).sqrt() + HP["eps"])
    torch.cuda.synchronize()
    assert_close(param, p64, 1e-5, 1e-6, "master")
    assert torch.equal(copy, param.bfloat16()), "param_copy is not the master rounded to bf16"


def test_adamw_grad_scale_and_all_dtype_combinations():
    n = 1001
    for p_dt in [torch.float32, torch.bfloat16, torch.float16]:
        for g_dt in [torch.float32, torch.bfloat16, torch.float16]:
            for s_dt in {torch.float32, p_dt}:
                param, m, v = adamw_buffers(n, p_dt, s_dt, 23)
                p0 = param.clone()
                grad = (torch.randn(n, device=DEV) * 0.2).to(g_dt)
                tigon.adamw_step(param, grad, m, v, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1, 0.5, None)
                # Step 1 with zero state: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps), g = 0.5 grad.
                g = 0.5 * grad.double()
                expected = p0.double() - 1e-2 * g / (g.abs() + 1e-8)
                # The kernel and the CPU path follow the same fp32 op order, so they must agree to an ulp.
                cpu_param, cpu_m, cpu_v = p0.cpu(), torch.zeros(n, dtype=s_dt), torch.zeros(n, dtype=s_dt)
                tigon.adamw_step(cpu_param, grad.cpu(), cpu_m, cpu_v, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1, 0.5, None)
                ulp = 2**-23 if p_dt == torch.float32 else 2**-7 if p_dt == torch.bfloat16 else 2**-10
                assert_close(param.cpu(), cpu_param.double(), ulp, 0.0, f"param vs CPU path {p_dt} {g_dt} {s_dt}")
                # Against the exact update in float64: fp32 rounds (1 - beta2) and (1 - beta1) and every
                # intermediate, a few ulps of the parameter (|p| <= ~3.5, fp32 ulp 2.4e-7) -> 4e-6 absolute.
                tol = 2e-6 if p_dt == torch.float32 else 2**-7
                assert_close(param, expected, tol, 2e-6, f"param {p_dt} grad {g_dt} state {s_dt}")
                # fp16 below 2**-14 is subnormal, with a fixed spacing of 2**-24: there the rounding error is
                # up to 2**-25 absolute, far more than 2**-7 relative of a value near zero.
                m_expected = 0.1 * 0.5 * grad.float()
                m_abs = 2**-25 if s_dt == torch.float16 else 0.0
                m_scale = m_expected.abs().max().item()
                assert_close(m, m_expected, 2**-7 if s_dt != torch.float32 else 1e-6, max(1e-9, m_abs / m_scale),
                             f"exp_avg {p_dt} grad {g_dt} state {s_dt}")


@pytest.mark.parametrize("n,offset", [(1, 0), (4097, 1), (3_000_017, 0), (64 * 2**20 + 3, 0)])
@pytest.mark.parametrize("g_dt", [torch.bfloat16, torch.float32])
def test_adamw_grad_square_partials_match_float64(n, offset, g_dt):
    """The squares summed in the update's own pass (the optimizer in backward's gradient norm): the partials
    sum to sum(grad^2) in float64 (exact squares, fp64 sums: 1e-12 relative), every entry is written even
    where the buffer held NaN, the update equals the one without partials bit for bit, and a second run
    gives the same partials (deterministic)."""
    param, m, v = adamw_buffers(n, torch.bfloat16, torch.bfloat16, 24, offset)
    p2, m2, v2 = param.clone(), m.clone(), v.clone()
    grad = (torch.randn(n + offset, device=DEV) * 0.3).to(g_dt)[offset:]
    partials = torch.full((2048,), float("nan"), device=DEV, dtype=torch.float64)
    tigon.adamw_step(param, grad, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.25, None, partials)
    tigon.adamw_step(p2, grad, m2, v2, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.25, None)
    torch.cuda.synchronize()
    assert torch.isfinite(partials).all(), "entries past the last block were not written"
    expected = grad.double().pow(2).sum().item()
    assert abs(partials.sum().item() - expected) <= 1e-12 * expected
    assert torch.equal(param, p2) and torch.equal(m, m2) and torch.equal(v, v2)
    again = torch.full((2048,), float("nan"), device=DEV, dtype=torch.float64)
    tigon.adamw_step(p2, grad, m2, v2, 1e-3, 0.9, 0.95, 1e-8, 0.1, 4, 0.25, None, again)
    assert torch.equal(partials, again)


def test_adamw_beyond_2_pow_31_elements():
    """2^31 + 17 bf16 elements (17 GB over four buffers): flat indices overflow int32 past element 2^31.
    Step 1 from zero state moves every parameter by lr * sign(g) (|g| >> eps), checked on slices at the start,
    around 2^31 and at the end."""
    n = 2**31 + 17
    param = torch.ones(n, device=DEV, dtype=torch.bfloat16)
    grad = torch.empty(n, device=DEV, dtype=torch.bfloat16)
    grad[0::2] = 0.5
    grad[1::2] = -0.25
    m = torch.zeros(n, device=DEV, dtype=torch.bfloat16)
    v = torch.zeros(n, device=DEV, dtype=torch.bfloat16)
    tigon.adamw_step(param, grad, m, v, 2**-6, 0.9, 0.999, 1e-8, 0.0, 1, 1.0, None)
    torch.cuda.synchronize()
    for start in [0, 2**31 - 64, n - 64]:
        idx = torch.arange(start, start + 64, device=DEV)
        expected = torch.where(idx % 2 == 0, 1 - 2**-6, 1 + 2**-6).to(torch.bfloat16)
        assert torch.equal(param[start:start + 64], expected), f"params at {start}"
        assert torch.equal(m[start:start + 64], (0.1 * grad[start:start + 64].float()).bfloat16()), f"exp_avg at {start}"
    del param, grad, m, v
    gc.collect()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------- squared_norm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 2049, 1_000_003, 64 * 2**20 + 5])
def test_squared_norm_matches_float64(dtype, n):
    x = (torch.randn(n, device=DEV, dtype=torch.float64) * 3).to(dtype)
    got = tigon.squared_norm(x)
    want = x.double().pow(2).sum()
    assert got.dtype == torch.float64 and got.device == x.device
    # Squares are exact in fp64; only the order of fp64 additions differs.
    assert abs(got.item() - want.item()) <= 1e-12 * want.item()
    assert tigon.squared_norm(x).item() == got.item(), "two calls on the same buffer must agree bit for bit"


def test_squared_norm_of_misaligned_and_strided_views():
    base = torch.randn(4096 * 3 + 1, device=DEV, dtype=torch.bfloat16)
    for view in (base[1:], base[3:-5], base.view(-1)[:4096 * 3].view(3, 4096).t()):
        want = view.double().pow(2).sum().item()
        assert abs(tigon.squared_norm(view).item() - want) <= 1e-12 * want


def test_squared_norm_past_two_to_the_31_elements():
    n = 2**31 + 17
    x = torch.empty(n, device=DEV, dtype=torch.bfloat16).fill_(0.5)
    x[-1] = 3.0
    assert tigon.squared_norm(x).item() == (n - 1) * 0.25 + 9.0
    del x
    gc.collect()
    torch.cuda.empty_cache()
