"""GPU suite for the norm, RoPE and gated-activation kernels: torch.ops.tigon.rms_norm, add_rms_norm,
layer_norm, rope, swiglu and geglu (CUDA path), forward and backward, against the Hugging Face
compositions written out below and evaluated in float64 on the same (rounded) inputs; and glu_linear
(activation + down projection): bit for bit its previous backward, and its forward+backward peak memory at
Llama-3-8B's MLP shape (torch.cuda.max_memory_allocated).

Run on the GPU machine (CUDA LibTorch build of libtigon_kernels.so):
    TIGON_KERNELS_LIB=build-gpu/kernels/libtigon_kernels.so /opt/torch/.venv/bin/python3 -m pytest -q tests/gpu/kernels/test_norm_rope_glu.py

Every case draws fresh random inputs (the seed is printed on failure), and fills the caching allocator
with NaN before each fused call so that an output element the kernel forgets to write shows up.

Tolerances, against the float64 reference (Liger's are fp32 atol 1e-7 / rtol 1e-5, bf16 atol 1e-3 /
rtol 1e-2, measured against the fp32 or bf16 eager module; here the reference is exact, so the budget is
the kernel's own rounding):
  * fp32 outputs: atol 1e-7, rtol 1e-5. Exceptions, each from a difference of two fp32 products whose
    absolute error scales with the products, not with their (possibly ~0) difference: RoPE outputs and all
    norm gradients (atol 1e-5), dweight/dbias sums over many rows (atol 1e-5 * sqrt(rows)).
  * bf16: atol 1e-3, rtol 1e-2: one rounding of the fp32 result is <= 2^-9 relative, Llama's extra cast of
    x_hat (emulated in the reference) adds a rare one-ulp disagreement (2^-8). fp16: atol 1e-3, rtol 5e-3
    (2^-11 per rounding, same structure).
  * Sums over rows (dweight, dbias) are compared with an atol proportional to the root of the sum of the
    squared terms: n rounded terms give an error relative to their magnitudes, not to the (possibly
    cancelling) total.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

# conftest.py has loaded the CUDA build of torch.ops.tigon.
DEV = torch.device("cuda")
tigon = torch.ops.tigon

LLAMA, GEMMA, NONE = 0, 1, 2  # tigon::RMSNormCasting
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (atol, rtol) for outputs computed elementwise from the inputs, vs float64.
TOL = {torch.float32: (1e-7, 1e-5), torch.bfloat16: (1e-3, 1e-2), torch.float16: (1e-3, 5e-3)}
# fp32 results with cancellation (a difference of products) get an absolute floor of 1e-5.
TOL_CANCEL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-3, 1e-2), torch.float16: (1e-3, 5e-3)}


# ----------------------------------------------------------------------------------------------- helpers


@pytest.fixture
def seed():
    value = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(value)
    print(f"seed {value}")
    return value


def poison_cache(nbytes):
    """Fills about `nbytes` of the caching allocator's free blocks (and 16 small-pool blocks) with 0xFF
    bytes, a NaN in fp32, bf16 and fp16; the next allocations reuse them."""
    big = torch.empty(max(int(nbytes), 1 << 21), dtype=torch.uint8, device=DEV).fill_(255)
    small = [torch.empty(1 << 20, dtype=torch.uint8, device=DEV).fill_(255) for _ in range(16)]
    del big, small


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def assert_close(actual, expected, tol, what):
    atol, rtol = tol
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def assert_sum_close(actual, expected, terms_sq_sum, dtype, what):
    """For a sum over rows: atol = eps_dtype-scale * sqrt(sum of squared terms) per column."""
    scale = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 5e-3}[dtype]
    rtol = TOL[dtype][1]
    limit = scale * terms_sq_sum.sqrt() + 1e-6 + rtol * expected.abs()
    diff = (actual.double() - expected).abs()
    worst = (diff - limit).max().item()
    assert worst <= 0, f"{what}: max |diff| {diff.max().item():.3e} exceeds tolerance by {worst:.3e}"


def misaligned(t):
    """Same values, storage offset by one element: the kernels must fall back from 16-byte packs."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


def leaf(t):
    return t.detach().requires_grad_(True)


# -------------------------------------------------------------------------- Hugging Face compositions (fp64)


def rms_norm_ref(x, w, eps, offset, casting, dtype):
    """LlamaRMSNorm / GemmaRMSNorm / plain, on float64 copies of the inputs. Llama's cast of x_hat back to
    the input dtype is emulated in the forward value (it is part of the module's semantics) with an exact
    float64 gradient through it; the kernels compute that gradient in fp32 where eager bf16 autograd would
    round dy * w to bf16 first."""
    x = x.double()
    w = w.double()
    x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if casting == LLAMA:
        x_hat = x_hat + (x_hat.to(dtype).double() - x_hat).detach()
        return (w + offset) * x_hat
    return x_hat * (w + offset)


def layer_norm_ref(x, w, b, eps):
    return F.layer_norm(x.double(), (x.shape[-1],), w.double(), None if b is None else b.double(), eps)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_ref(q, k, cos, sin):
    """apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) of transformers."""
    cos, sin = cos.double(), sin.double()
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = q.double(), k.double()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def swiglu_ref(a, b):
    return F.silu(a.double()) * b.double()


def geglu_ref(a, b):
    return F.gelu(a.double(), approximate="tanh") * b.double()


def rotary_tables(batch, seq_len, dim, dtype, per_batch):
    """LlamaRotaryEmbedding's cos/sin: cat(freqs, freqs); [T, D], or [B, T, D] with shifted positions."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=DEV, dtype=torch.float64) / dim))
    starts = torch.arange(batch, device=DEV, dtype=torch.float64) * 17 if per_batch else torch.zeros(1, device=DEV)
    pos = starts.double()[:, None] + torch.arange(seq_len, device=DEV, dtype=torch.float64)[None, :]
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return (cos, sin) if per_batch else (cos[0], sin[0])


# --------------------------------------------------------------------------------------------- RMSNorm

NORM_SHAPES = [(257, 4096), (33, 4095), (1, 4096), (2, 7, 640), (5, 20000), (64, 8)]
MODES = [(LLAMA, 0.0), (GEMMA, 1.0), (NONE, 0.0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("casting,offset", MODES, ids=["llama", "gemma", "none"])
def test_rms_norm(seed, dtype, shape, casting, offset):
    eps = 1e-6
    x = leaf(torch.randn(shape, device=DEV).to(dtype))
    w = leaf((1 + 0.1 * torch.randn(shape[-1], device=DEV)).to(dtype))
    poison_cache(4 * nbytes(x))
    y = tigon.rms_norm(x, w, eps, offset, casting)
    ref = rms_norm_ref(x, w, eps, offset, casting, dtype)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, ref, TOL[dtype], "y")

    dy = torch.randn(shape, device=DEV).to(dtype)
    poison_cache(4 * nbytes(x))
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = leaf(x.double()), leaf(w.double())
    dx_ref, dw_ref = torch.autograd.grad(rms_norm_ref(x64, w64, eps, offset, casting, dtype), (x64, w64), dy.double())
    assert_close(dx, dx_ref, TOL_CANCEL[dtype], "dx")
    x_hat = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
    terms = (dy.double() * x_hat).reshape(-1, shape[-1])
    assert_sum_close(dw, dw_ref, terms.pow(2).sum(0), dtype, "dweight")


@pytest.mark.parametrize("casting,offset", MODES, ids=["llama", "gemma", "none"])
def test_rms_norm_fp32_weight_on_bf16_input(seed, casting, offset):
    x = leaf(torch.randn(96, 1024, device=DEV).to(torch.bfloat16))
    w = leaf(1 + 0.1 * torch.randn(1024, device=DEV))
    poison_cache(4 * nbytes(x))
    y = tigon.rms_norm(x, w, 1e-5, offset, casting)
    # Hugging Face's type promotion: Gemma casts back to the input dtype, the others return fp32.
    assert y.dtype == (torch.bfloat16 if casting == GEMMA else torch.float32)
    assert_close(y, rms_norm_ref(x, w, 1e-5, offset, casting, torch.bfloat16), TOL[torch.bfloat16], "y")
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    x64, w64 = leaf(x.double()), leaf(w.double())
    dx_ref, dw_ref = torch.autograd.grad(rms_norm_ref(x64, w64, 1e-5, offset, casting, torch.bfloat16), (x64, w64),
                                         dy.double())
    assert_close(dx, dx_ref, TOL[torch.bfloat16], "dx")
    assert_close(dw, dw_ref, (1e-2 * math.sqrt(96), 1e-2), "dweight")


@pytest.mark.parametrize("layout", ["row_slice", "transposed", "misaligned"])
def test_rms_norm_non_contiguous(seed, layout):
    dtype = torch.bfloat16
    base = torch.randn(300, 4096 + 64, device=DEV).to(dtype)
    if layout == "row_slice":
        x = base[:, 32:32 + 4096]  # rows farther apart than hidden
    elif layout == "transposed":
        x = base[:, :300].t()  # hidden not innermost in memory
    else:
        x = misaligned(base[:, :4096].contiguous())
    x = leaf(x)
    w = leaf((1 + 0.1 * torch.randn(x.shape[-1], device=DEV)).to(dtype))
    poison_cache(4 * nbytes(x))
    y = tigon.rms_norm(x, w, 1e-6, 0.0, LLAMA)
    assert_close(y, rms_norm_ref(x, w, 1e-6, 0.0, LLAMA, dtype), TOL[dtype], f"{layout} y")
    dy = torch.randn(x.shape[1], x.shape[0], device=DEV).to(dtype).t()  # strided incoming gradient
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = leaf(x.double()), leaf(w.double())
    dx_ref, dw_ref = torch.autograd.grad(rms_norm_ref(x64, w64, 1e-6, 0.0, LLAMA, dtype), (x64, w64), dy.double())
    assert_close(dx, dx_ref, TOL[dtype], f"{layout} dx")
    assert_close(dw, dw_ref, (1e-2 * math.sqrt(x.shape[0]), 1e-2), f"{layout} dweight")


def test_rms_norm_weight_gradient_is_deterministic(seed):
    x = leaf(torch.randn(8192, 4096, device=DEV).to(torch.bfloat16))
    w = leaf(torch.randn(4096, device=DEV).to(torch.bfloat16))
    dy = torch.randn(8192, 4096, device=DEV).to(torch.bfloat16)
    grads = [torch.autograd.grad(tigon.rms_norm(x, w, 1e-6, 0.0, LLAMA), (x, w), dy) for _ in range(3)]
    for dx, dw in grads[1:]:
        assert torch.equal(dx, grads[0][0]) and torch.equal(dw, grads[0][1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(129, 4096), (3, 4095), (1, 20000)], ids=str)
def test_add_rms_norm(seed, dtype, shape):
    eps = 1e-6
    x = leaf(torch.randn(shape, device=DEV).to(dtype))
    residual = leaf(torch.randn(shape, device=DEV).to(dtype))
    w = leaf((1 + 0.1 * torch.randn(shape[-1], device=DEV)).to(dtype))
    poison_cache(6 * nbytes(x))
    y, residual_out = tigon.add_rms_norm(x, residual, w, eps, 0.0, LLAMA)
    # Hugging Face adds in the activation dtype; the norm sees that rounded sum.
    h = x + residual
    assert torch.equal(residual_out, h)
    assert_close(y, rms_norm_ref(h, w, eps, 0.0, LLAMA, dtype), TOL[dtype], "y")

    dy, dres = torch.randn(shape, device=DEV).to(dtype), torch.randn(shape, device=DEV).to(dtype)
    poison_cache(6 * nbytes(x))
    dx, dr, dw = torch.autograd.grad((y, residual_out), (x, residual, w), (dy, dres))
    h64, w64 = leaf(h.double()), leaf(w.double())
    dh_ref, dw_ref = torch.autograd.grad(rms_norm_ref(h64, w64, eps, 0.0, LLAMA, dtype), (h64, w64), dy.double())
    dh_ref = dh_ref + dres.double()
    assert_close(dx, dh_ref, TOL_CANCEL[dtype], "dx")
    assert_close(dr, dh_ref, TOL_CANCEL[dtype], "dresidual")
    x_hat = h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + eps)
    assert_sum_close(dw, dw_ref, (dy.double() * x_hat).pow(2).sum(0), dtype, "dweight")


# ------------------------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_layer_norm(seed, dtype, shape, with_bias):
    eps = 1e-5
    # A mean far from zero: the variance must come from centred values.
    x = leaf((torch.randn(shape, device=DEV) * 2 + 3).to(dtype))
    w = leaf(torch.randn(shape[-1], device=DEV).to(dtype))
    b = leaf(torch.randn(shape[-1], device=DEV).to(dtype)) if with_bias else None
    poison_cache(4 * nbytes(x))
    y = tigon.layer_norm(x, w, b, eps)
    assert y.dtype == dtype
    # w * x_hat + b can cancel: the absolute floor of TOL_CANCEL.
    assert_close(y, layer_norm_ref(x, w, b, eps), TOL_CANCEL[dtype], "y")

    dy = torch.randn(shape, device=DEV).to(dtype)
    inputs = (x, w) + ((b,) if with_bias else ())
    poison_cache(4 * nbytes(x))
    grads = torch.autograd.grad(y, inputs, dy)
    inputs64 = tuple(leaf(t.double()) for t in inputs)
    grads_ref = torch.autograd.grad(layer_norm_ref(*inputs64[:2], inputs64[2] if with_bias else None, eps), inputs64,
                                    dy.double())
    assert_close(grads[0], grads_ref[0], TOL_CANCEL[dtype], "dx")
    x64 = x.double()
    x_hat = (x64 - x64.mean(-1, keepdim=True)) * torch.rsqrt(x64.var(-1, unbiased=False, keepdim=True) + eps)
    dy64 = dy.double().reshape(-1, shape[-1])
    assert_sum_close(grads[1], grads_ref[1], (dy64 * x_hat.reshape(-1, shape[-1])).pow(2).sum(0), dtype, "dweight")
    if with_bias:
        assert_sum_close(grads[2], grads_ref[2], dy64.pow(2).sum(0), dtype, "dbias")


@pytest.mark.parametrize("layout", ["row_slice", "transposed", "misaligned"])
def test_layer_norm_non_contiguous(seed, layout):
    dtype = torch.bfloat16
    base = torch.randn(300, 4096 + 64, device=DEV).to(dtype)
    x = {"row_slice": lambda: base[:, 32:32 + 4096], "transposed": lambda: base[:, :300].t(),
         "misaligned": lambda: misaligned(base[:, :4096].contiguous())}[layout]()
    x = leaf(x)
    w = leaf(torch.randn(x.shape[-1], device=DEV).to(dtype))
    b = leaf(torch.randn(x.shape[-1], device=DEV).to(dtype))
    poison_cache(4 * nbytes(x))
    y = tigon.layer_norm(x, w, b, 1e-5)
    assert_close(y, layer_norm_ref(x, w, b, 1e-5), TOL[dtype], f"{layout} y")
    dy = torch.randn(x.shape[1], x.shape[0], device=DEV).to(dtype).t()
    grads = torch.autograd.grad(y, (x, w, b), dy)
    x64, w64, b64 = leaf(x.double()), leaf(w.double()), leaf(b.double())
    grads_ref = torch.autograd.grad(layer_norm_ref(x64, w64, b64, 1e-5), (x64, w64, b64), dy.double())
    assert_close(grads[0], grads_ref[0], TOL[dtype], f"{layout} dx")
    for g, g_ref, name in zip(grads[1:], grads_ref[1:], ("dweight", "dbias")):
        assert_close(g, g_ref, (1e-2 * math.sqrt(x.shape[0]), 1e-2), f"{layout} {name}")


# ------------------------------------------------------------------------------------------------- RoPE

ROPE_CASES = [  # batch, q heads, k heads, seq, head dim, table: "TD" | "BTD" | "1TD"
    (2, 32, 8, 129, 128, "TD"),
    (1, 4, 4, 1, 64, "BTD"),
    (3, 5, 1, 17, 6, "1TD"),  # half = 3: no 16-byte packs
    (2, 12, 4, 33, 80, "BTD"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROPE_CASES, ids=str)
def test_rope(seed, dtype, case):
    batch, hq, hk, seq, dim, table = case
    # Hugging Face's layout: projections [B, T, H, D] viewed as [B, H, T, D] (non-contiguous).
    q = leaf(torch.randn(batch, seq, hq, dim, device=DEV).to(dtype).transpose(1, 2))
    k = leaf(torch.randn(batch, seq, hk, dim, device=DEV).to(dtype).transpose(1, 2))
    cos, sin = rotary_tables(batch, seq, dim, dtype, per_batch=(table == "BTD"))
    if table == "1TD":
        cos, sin = cos[None], sin[None]
    poison_cache(4 * nbytes(q, k))
    q_out, k_out = tigon.rope(q, k, cos, sin)
    q_ref, k_ref = rope_ref(q, k, cos, sin)
    assert q_out.dtype == dtype and q_out.shape == q.shape and k_out.shape == k.shape
    assert_close(q_out, q_ref, TOL_CANCEL[dtype], "q")
    assert_close(k_out, k_ref, TOL_CANCEL[dtype], "k")

    # Incoming gradients as SDPA's backward leaves them: not contiguous (the bug the Liger paper reports).
    dq = torch.randn(batch, seq, hq, dim, device=DEV).to(dtype).transpose(1, 2)
    dk = torch.randn(batch, seq, hk, dim, device=DEV).to(dtype).transpose(1, 2)
    poison_cache(4 * nbytes(q, k))
    gq, gk = torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))
    q64, k64 = leaf(q.double()), leaf(k.double())
    gq_ref, gk_ref = torch.autograd.grad(rope_ref(q64, k64, cos, sin), (q64, k64), (dq.double(), dk.double()))
    assert_close(gq, gq_ref, TOL_CANCEL[dtype], "dq")
    assert_close(gk, gk_ref, TOL_CANCEL[dtype], "dk")


def test_rope_arbitrary_tables_and_misaligned_inputs(seed):
    """Tables whose halves differ exercise the general rotation and its transpose, not just by -sin."""
    dtype = torch.float32
    q = leaf(misaligned(torch.randn(2, 4, 9, 16, device=DEV)))
    k = leaf(torch.randn(2, 2, 9, 16, device=DEV))
    cos, sin = torch.randn(9, 16, device=DEV), torch.randn(9, 16, device=DEV)
    q_out, k_out = tigon.rope(q, k, cos, sin)
    q_ref, k_ref = rope_ref(q, k, cos, sin)
    assert_close(q_out, q_ref, TOL_CANCEL[dtype], "q")
    assert_close(k_out, k_ref, TOL_CANCEL[dtype], "k")
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    gq, gk = torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))
    q64, k64 = leaf(q.double()), leaf(k.double())
    gq_ref, gk_ref = torch.autograd.grad(rope_ref(q64, k64, cos, sin), (q64, k64), (dq.double(), dk.double()))
    assert_close(gq, gq_ref, TOL_CANCEL[dtype], "dq")
    assert_close(gk, gk_ref, TOL_CANCEL[dtype], "dk")


# ------------------------------------------------------------------------------------------ SwiGLU, GeGLU

GLU = {"swiglu": (lambda a, b: tigon.swiglu(a, b), swiglu_ref), "geglu": (lambda a, b: tigon.geglu(a, b), geglu_ref)}
GLU_SHAPES = [(64, 14336), (5, 4095), (1, 8), (2, 3, 37)]


@pytest.mark.parametrize("op", list(GLU))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GLU_SHAPES, ids=str)
def test_glu(seed, op, dtype, shape):
    fused, reference = GLU[op]
    a = leaf((torch.randn(shape, device=DEV) * 3).to(dtype))  # both saturated tails of the activation
    b = leaf(torch.randn(shape, device=DEV).to(dtype))
    poison_cache(4 * nbytes(a))
    y = fused(a, b)
    assert y.dtype == dtype
    assert_close(y, reference(a, b), TOL[dtype], f"{op} y")
    dy = torch.randn(shape, device=DEV).to(dtype)
    poison_cache(4 * nbytes(a))
    da, db = torch.autograd.grad(y, (a, b), dy)
    a64, b64 = leaf(a.double()), leaf(b.double())
    da_ref, db_ref = torch.autograd.grad(reference(a64, b64), (a64, b64), dy.double())
    # da = dy * b * act'(a): products only, but act' has a cancellation (1 + a (1 - s)) near a ~ -1.28.
    assert_close(da, da_ref, TOL_CANCEL[dtype], f"{op} da")
    assert_close(db, db_ref, TOL[dtype], f"{op} db")


@pytest.mark.parametrize("op", list(GLU))
@pytest.mark.parametrize("layout", ["fused_gate_up", "misaligned", "transposed"])
def test_glu_non_contiguous(seed, op, layout):
    fused, reference = GLU[op]
    dtype = torch.bfloat16
    if layout == "fused_gate_up":  # Phi3's gate_up_proj output, split in two strided halves
        gate_up = torch.randn(77, 2 * 1024, device=DEV).to(dtype)
        a, b = gate_up.chunk(2, dim=-1)
    elif layout == "misaligned":
        a, b = misaligned(torch.randn(77, 1024, device=DEV).to(dtype)), torch.randn(77, 1024, device=DEV).to(dtype)
    else:
        a, b = torch.randn(1024, 77, device=DEV).to(dtype).t(), torch.randn(1024, 77, device=DEV).to(dtype).t()
    a, b = leaf(a), leaf(b)
    poison_cache(4 * nbytes(a))
    y = fused(a, b)
    assert_close(y, reference(a, b), TOL[dtype], f"{op} {layout} y")
    dy = torch.randn(y.shape[1], y.shape[0], device=DEV).to(dtype).t()
    da, db = torch.autograd.grad(y, (a, b), dy)
    a64, b64 = leaf(a.double()), leaf(b.double())
    da_ref, db_ref = torch.autograd.grad(reference(a64, b64), (a64, b64), dy.double())
    assert_close(da, da_ref, TOL_CANCEL[dtype], f"{op} {layout} da")
    assert_close(db, db_ref, TOL[dtype], f"{op} {layout} db")


# ------------------------------------------------------------------------------ past 2^31 elements (bf16)


def sample_rows(rows):
    """First, last, around the 2^31-element boundary and random rows."""
    picks = torch.cat([torch.tensor([0, rows - 1], device=DEV), torch.randint(0, rows, (61,), device=DEV)])
    return picks.unique()


@pytest.mark.parametrize("op", list(GLU))
def test_glu_past_int32_elements(seed, op):
    fused, reference = GLU[op]
    cols = 14336
    rows = (1 << 31) // cols + 3  # 2^31 + 14336*3 - remainder elements, about 4 GiB per bf16 tensor
    a = leaf(torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16))
    b = leaf(torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16))
    assert a.numel() > 1 << 31
    y = fused(a, b)
    # The last row lies beyond element 2^31: int32 offsets would wrap and write elsewhere.
    idx = torch.cat([sample_rows(rows), torch.tensor([(1 << 31) // cols], device=DEV)]).unique()
    assert_close(y[idx], reference(a[idx], b[idx]), TOL[torch.bfloat16], f"{op} y rows")
    dy = torch.randn(rows, cols, device=DEV, dtype=torch.bfloat16)
    da, db = torch.autograd.grad(y, (a, b), dy)
    del y
    a64, b64 = leaf(a[idx].double()), leaf(b[idx].double())
    da_ref, db_ref = torch.autograd.grad(reference(a64, b64), (a64, b64), dy[idx].double())
    assert_close(da[idx], da_ref, TOL[torch.bfloat16], f"{op} da rows")
    assert_close(db[idx], db_ref, TOL[torch.bfloat16], f"{op} db rows")


def test_rms_norm_past_int32_elements(seed):
    hidden = 4096
    rows = (1 << 31) // hidden + 5
    x = leaf(torch.randn(rows, hidden, device=DEV, dtype=torch.bfloat16))
    w = leaf((1 + 0.1 * torch.randn(hidden, device=DEV)).to(torch.bfloat16))
    assert x.numel() > 1 << 31
    y = tigon.rms_norm(x, w, 1e-6, 0.0, LLAMA)
    idx = torch.cat([sample_rows(rows), torch.arange(rows - 6, rows, device=DEV)]).unique()
    assert_close(y[idx], rms_norm_ref(x[idx], w, 1e-6, 0.0, LLAMA, torch.bfloat16), TOL[torch.bfloat16], "y rows")
    dy = torch.randn(rows, hidden, device=DEV, dtype=torch.bfloat16)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    del y
    x64, w64 = leaf(x[idx].double()), leaf(w.double())
    dx_ref, _ = torch.autograd.grad(rms_norm_ref(x64, w64, 1e-6, 0.0, LLAMA, torch.bfloat16), (x64, w64),
                                    dy[idx].double())
    assert_close(dx[idx], dx_ref, TOL[torch.bfloat16], "dx rows")
    # dweight over every row, in float64 chunks: every row's partial sum must reach the total.
    dw_ref = torch.zeros(hidden, device=DEV, dtype=torch.float64)
    sq = torch.zeros(hidden, device=DEV, dtype=torch.float64)
    for start in range(0, rows, 1 << 15):
        xc = x[start:start + (1 << 15)].double()
        x_hat = (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16).double()
        terms = dy[start:start + (1 << 15)].double() * x_hat
        dw_ref += terms.sum(0)
        sq += terms.pow(2).sum(0)
    assert_sum_close(dw, dw_ref, sq, torch.bfloat16, "dweight over all rows")


# ------------------------------------------------------------------------ glu_linear (activation + down_proj)


def glu_linear_previous(op, a, b, w, dy):
    """glu_linear's backward as it was before grad_a went in place over grad_h: h recomputed with its autograd
    graph, dw = dy^T h, grad_h = dy @ w, (da, db) from autograd through the fused activation."""
    fused, _ = GLU[op]
    a_leaf, b_leaf = leaf(a), leaf(b)
    h = fused(a_leaf, b_leaf)
    dw = dy.reshape(-1, w.shape[0]).t().mm(h.detach().reshape(-1, w.shape[1]))
    da, db = torch.autograd.grad(h, (a_leaf, b_leaf), dy.matmul(w))
    return da, db, dw


GLU_LINEAR_CASES = [  # name: (a and b's shape, out features, layout)
    ("llama_mlp", (2, 129, 1024), 384, "plain"),
    ("odd", (7, 37), 19, "plain"),
    ("gate_up_halves", (77, 1024), 256, "fused_gate_up"),
    ("transposed", (77, 1024), 256, "transposed"),
    ("misaligned", (77, 1024), 256, "misaligned"),
]


def glu_linear_inputs(shape, out_features, layout, dtype):
    if layout == "fused_gate_up":
        a, b = (torch.randn(*shape[:-1], 2 * shape[-1], device=DEV) * 3).to(dtype).chunk(2, dim=-1)
    elif layout == "transposed":
        a = (torch.randn(shape[1], shape[0], device=DEV) * 3).to(dtype).t()
        b = torch.randn(shape[1], shape[0], device=DEV).to(dtype).t()
    else:
        a = (torch.randn(shape, device=DEV) * 3).to(dtype)
        b = torch.randn(shape, device=DEV).to(dtype)
        if layout == "misaligned":
            a = misaligned(a)
    w = (torch.randn(out_features, shape[-1], device=DEV) / math.sqrt(shape[-1])).to(dtype)
    dy = torch.randn(*shape[:-1], out_features, device=DEV).to(dtype)
    if layout == "transposed":  # and a transposed incoming gradient
        dy = torch.randn(out_features, shape[0], device=DEV).to(dtype).t()
    return a, b, w, dy


@pytest.mark.parametrize("op", list(GLU))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GLU_LINEAR_CASES, ids=lambda c: c[0])
def test_glu_linear(seed, op, dtype, case):
    """Bit for bit the previous backward (same kernels and matmuls, grad_a now written over grad_h), and
    within tolerance of float64 arithmetic on the same rounded inputs."""
    _, shape, out_features, layout = case
    a, b, w, dy = glu_linear_inputs(shape, out_features, layout, dtype)
    a, b, w = leaf(a), leaf(b), leaf(w)
    poison_cache(8 * nbytes(a))
    y = tigon.glu_linear(a, b, w, None, op == "geglu")
    poison_cache(8 * nbytes(a))
    da, db, dw = torch.autograd.grad(y, (a, b, w), dy)
    da_prev, db_prev, dw_prev = glu_linear_previous(op, a.detach(), b.detach(), w.detach(), dy)
    assert torch.equal(y, F.linear(GLU[op][0](a.detach(), b.detach()), w.detach())), "y"
    assert torch.equal(da, da_prev), "da differs from the previous backward"
    assert torch.equal(db, db_prev), "db differs from the previous backward"
    assert torch.equal(dw, dw_prev), "dw differs from the previous backward"

    # float64: h and grad_h are rounded to the dtype before their matmuls in the fused path, and cuBLAS may
    # reduce split-K partial sums in the dtype (PyTorch's default for bf16/fp16). Bounds relative to the
    # largest entry: bf16 2^-8 and fp16 2^-11 per rounding, a few roundings deep; fp32 (no TF32) ~1e-6 each.
    rel = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}[dtype]
    a64, b64, w64 = leaf(a.detach().double()), leaf(b.detach().double()), leaf(w.detach().double())
    y64 = F.linear(GLU[op][1](a64, b64), w64)
    grads64 = torch.autograd.grad(y64, (a64, b64, w64), dy.double())
    for name, actual, expected in zip(("y", "da", "db", "dw"), (y, da, db, dw), (y64,) + grads64):
        diff = (actual.double() - expected).abs().max().item()
        assert diff <= rel * expected.abs().max().item(), f"{name}: max |diff| {diff:.3e}"


@pytest.mark.parametrize("op", list(GLU))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GLU_LINEAR_CASES, ids=lambda c: c[0])
def test_glu_linear_consuming_inputs(seed, op, dtype, case):
    """The decoder's variant, given non-leaf a and b it may overwrite: y and every gradient bit for bit
    glu_linear's. With a contiguous a, backward writes h = act(a) * b in the activation's backward pass (over
    grad_y @ w) instead of a pass of its own, and a's and b's buffers end up holding their gradients."""
    _, shape, out_features, layout = case
    a0, b0, w0, dy = glu_linear_inputs(shape, out_features, layout, dtype)
    gelu = op == "geglu"
    a, b, w = leaf(a0), leaf(b0), leaf(w0)
    y = tigon.glu_linear(a, b, w, None, gelu)
    da, db, dw = torch.autograd.grad(y, (a, b, w), dy)

    a_leaf, b_leaf, w_leaf = leaf(a0), leaf(b0), leaf(w0)
    a_in, b_in = a_leaf * 1, b_leaf * 1  # fresh buffers (transposed ones keep their strides)
    if layout == "fused_gate_up":  # the two halves of one product, as Phi3's gate_up gives
        a_in, b_in = torch.cat((a_leaf, b_leaf), -1).chunk(2, dim=-1)
    taken = {name: t.is_contiguous() and layout != "fused_gate_up" for name, t in (("a", a_in), ("b", b_in))}
    poison_cache(8 * nbytes(a0))
    y_c = tigon.glu_linear_consuming_inputs(a_in, b_in, w_leaf, None, gelu)
    poison_cache(8 * nbytes(a0))
    da_c, db_c, dw_c = torch.autograd.grad(y_c, (a_leaf, b_leaf, w_leaf), dy)
    assert torch.equal(y_c, y), "y"
    assert torch.equal(da_c, da), "da differs from glu_linear's"
    assert torch.equal(db_c, db), "db differs from glu_linear's"
    assert torch.equal(dw_c, dw), "dw differs from glu_linear's"
    # A contiguous input not sharing memory with the other holds its gradient; any other is left as it was.
    for name, buf, grad, before in (("a", a_in, da, a0), ("b", b_in, db, b0)):
        expected = grad if taken[name] else before
        assert torch.equal(buf, expected), f"{name}'s buffer: {'its gradient' if taken[name] else 'untouched'}"


def glu_linear_fwd_bwd_peak(run, inputs, dy):
    """Peak bytes allocated above what is live before `run` (the inputs, dy), over forward and backward
    together, with the returned gradients counted. A first pass warms up the cuBLAS workspace."""
    for measured in (False, True):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = run()
        grads = torch.autograd.grad(y, inputs, dy)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del y, grads
    return peak


@pytest.mark.parametrize("op", list(GLU))
@pytest.mark.parametrize("tokens", [8192, 32768])
def test_glu_linear_backward_memory(op, tokens):
    """Llama-3-8B's MLP (H = 4096, I = 14336, bf16). The backward holds at most two [T, I] buffers at once
    (h, then grad_h overwritten by grad_a, and grad_b) besides the saved a, b: the peak above the inputs is
    2 T I (the returned grad_a and grad_b) + T H (the output y, alive through backward) + H I (the weight
    gradient) + 32 MiB. Recomputing h with its graph and asking autograd for grad_a and grad_b held
    4 T I; the unfused composition holds more still, which this bound must reject."""
    T, H, I = tokens, 4096, 14336
    gelu = op == "geglu"
    dtype = torch.bfloat16
    a = leaf(torch.randn(T, I, device=DEV, dtype=dtype))
    b = leaf(torch.randn(T, I, device=DEV, dtype=dtype))
    w = leaf((torch.randn(H, I, device=DEV, dtype=dtype) * 0.01))
    dy = torch.randn(T, H, device=DEV, dtype=dtype)
    es = torch.finfo(dtype).bits // 8
    mib = 1 << 20
    bound = (2 * T * I + T * H + H * I) * es + 32 * mib

    fused = glu_linear_fwd_bwd_peak(lambda: tigon.glu_linear(a, b, w, None, gelu), (a, b, w), dy)
    activation = (lambda x: F.gelu(x, approximate="tanh")) if gelu else F.silu
    unfused = glu_linear_fwd_bwd_peak(lambda: F.linear(activation(a) * b, w), (a, b, w), dy)
    print(f"T={T} {op}: glu_linear peak {fused / mib:.0f} MiB, 2TI+TH+HI {(bound - 32 * mib) / mib:.0f} MiB, "
          f"4TI+TH+HI {((4 * T * I + T * H + H * I) * es) / mib:.0f} MiB, unfused {unfused / mib:.0f} MiB")
    assert fused <= bound, f"glu_linear fwd+bwd peak {fused / mib:.0f} MiB above the inputs > {bound / mib:.0f} MiB"
    assert unfused > bound, "the unfused composition fits the bound: the measurement does not see transients"
