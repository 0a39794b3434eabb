// The gated activations y = act(a) * b as autograd functions, one template over the activation:
//   swiglu: act = silu (SwiGLUFunction),  geglu: act = gelu_tanh, GELU with approximate="tanh"
//   (GeGLUFunction).
// CUDA tensors go to kernels/cuda/glu.cu; CPU tensors run the same math here in fp32 (float64 for float64
// inputs), rounded once.
// Saved: a and b. Backward recomputes the activation instead of keeping it.
// swiglu_backward_out / geglu_backward_out are the same backward outside autograd, into given outputs that
// may be the incoming gradient itself (written in place): glu_linear uses them to put da over a gradient it
// owns.
#include "kernels/cuda/glu.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/op_helpers.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// ---- the activations ------------------------------------------------------------------------------------
// Each gives, on fp32 (or float64) tensors, the sigmoid s with act(a) = a * s, and da from g = dy * b.

// silu(a) = a * sigmoid(a); silu'(a) = s (1 + a (1 - s)).
struct SiLU {
  static constexpr const char* kName = "swiglu";
  static torch::Tensor Sigmoid(const torch::Tensor& a) { return torch::sigmoid(a); }
  static torch::Tensor InputGrad(const torch::Tensor& g, const torch::Tensor& a, const torch::Tensor& s) {
    return g * s * (1.0 + a * (1.0 - s));
  }
#ifdef TIGON_CUDA_KERNELS
  static constexpr auto kForwardCuda = &cuda::swiglu_forward;
  static constexpr auto kBackwardCuda = &cuda::swiglu_backward;
  static constexpr const char* kForwardLaunch = "swiglu_forward";
  static constexpr const char* kBackwardLaunch = "swiglu_backward";
#endif
};

// gelu_tanh(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2u), u = sqrt(2/pi) (a + 0.044715 a^3): the sigmoid form
// (as in the CUDA kernel) has no cancellation in 1 + tanh(u) for large negative a.
// gelu'(a) = s + 2 a s (1 - s) u'(a), s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 a^2).
struct GeluTanh {
  static constexpr const char* kName = "geglu";
  static constexpr double kSqrt2OverPi = 0.7978845608028654;
  static constexpr double kCubic = 0.044715;
  static torch::Tensor Sigmoid(const torch::Tensor& a) {
    return torch::sigmoid(2.0 * kSqrt2OverPi * (a + kCubic * a * a * a));
  }
  static torch::Tensor InputGrad(const torch::Tensor& g, const torch::Tensor& a, const torch::Tensor& s) {
    return g * (s + 2.0 * a * s * (1.0 - s) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * a * a));
  }
#ifdef TIGON_CUDA_KERNELS
  static constexpr auto kForwardCuda = &cuda::geglu_forward;
  static constexpr auto kBackwardCuda = &cuda::geglu_backward;
  static constexpr const char* kForwardLaunch = "geglu_forward";
  static constexpr const char* kBackwardLaunch = "geglu_backward";
#endif
};

// ---- operand checks -------------------------------------------------------------------------------------

void CheckInputs(const char* op, const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 1, "tigon::", op, ": a needs at least one dim");
  TORCH_CHECK(a.sizes() == b.sizes(), "tigon::", op, ": a ", a.sizes(), " and b ", b.sizes(), " differ");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "tigon::", op, ": a is ", a.scalar_type(), ", b is ",
              b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "tigon::", op, ": a and b on different devices");
}

// dy like a; da, db and h (optional: undefined for none) contiguous like a, apart from each other, and
// each either exactly one of dy, a, b (same elements, same strides) or apart from all three.
void CheckBackwardOperands(const char* op, const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                           const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  CheckInputs(op, a, b);
  TORCH_CHECK(dy.sizes() == a.sizes() && dy.scalar_type() == a.scalar_type() && dy.device() == a.device(),
              "tigon::", op, "_backward_out: dy must match a (", a.sizes(), ", ", a.scalar_type(), "), got ",
              dy.sizes(), ", ", dy.scalar_type());
  for (const auto* out : {&da, &db, &h}) {
    if (!out->defined()) continue;  // h only
    TORCH_CHECK(out->sizes() == a.sizes() && out->scalar_type() == a.scalar_type() && out->device() == a.device() &&
                    out->is_contiguous(),
                "tigon::", op, "_backward_out: da, db and h must be contiguous with a's shape, dtype and device");
    for (const auto* in : {&dy, &a, &b}) at::assert_no_partial_overlap(*out, *in);
  }
  at::assert_no_overlap(da, db);
  if (h.defined()) {
    at::assert_no_overlap(h, da);
    at::assert_no_overlap(h, db);
  }
}

// ---- CPU fused path -------------------------------------------------------------------------------------

template <typename Act>
torch::Tensor ForwardCpu(const torch::Tensor& a, const torch::Tensor& b) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc);
  return (af * Act::Sigmoid(af) * b.to(acc)).to(a.scalar_type());
}

// da and db may be dy, a or b themselves: both are computed in full before either is stored.
template <typename Act>
void BackwardCpu(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& da,
                 const torch::Tensor& db, const torch::Tensor& h) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc), bf = b.to(acc), dyf = dy.to(acc);
  auto s = Act::Sigmoid(af);
  auto da_acc = Act::InputGrad(dyf * bf, af, s);
  auto db_acc = dyf * af * s;
  // h: the forward's products in the forward's order, so it equals the forward's output.
  torch::Tensor h_acc = h.defined() ? af * s * bf : torch::Tensor();
  da.copy_(da_acc);
  db.copy_(db_acc);
  if (h.defined()) h.copy_(h_acc);
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
cuda::GluOperand Operand(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}
cuda::GluOutput Output(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}

template <typename Act>
torch::Tensor ForwardCuda(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t cols = a.size(-1);
  auto a2d = AsRows(a, cols), b2d = AsRows(b, cols);
  auto y = torch::empty({a2d.size(0), a2d.size(1)}, a.options());
  if (y.numel() == 0) return y.view(a.sizes());
  cuda::GluForwardParams p;
  p.a = Operand(a2d);
  p.b = Operand(b2d);
  p.y = Output(y);
  p.rows = a2d.size(0);
  p.cols = a2d.size(1);
  p.dtype = CudaDType(a);
  CheckLaunch(Act::kForwardCuda(p, CurrentCudaStream(a.device())), Act::kForwardLaunch);
  return y.view(a.sizes());
}

// dy in a's dtype; da and db contiguous (the kernel reads every element before writing it, so either may be
// dy, a or b).
template <typename Act>
void BackwardCuda(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& da,
                  const torch::Tensor& db, const torch::Tensor& h) {
  if (da.numel() == 0) return;
  const int64_t cols = a.size(-1);
  auto a2d = AsRows(a, cols), b2d = AsRows(b, cols), dy2d = AsRows(dy, cols);
  cuda::GluBackwardParams p;
  p.dy = Operand(dy2d);
  p.a = Operand(a2d);
  p.b = Operand(b2d);
  p.da = Output(da.view({-1, cols}));
  p.db = Output(db.view({-1, cols}));
  if (h.defined()) p.h = Output(h.view({-1, cols}));
  p.rows = a2d.size(0);
  p.cols = cols;
  p.dtype = CudaDType(a);
  CheckLaunch(Act::kBackwardCuda(p, CurrentCudaStream(a.device())), Act::kBackwardLaunch);
}
#endif  // TIGON_CUDA_KERNELS

// da, db: contiguous, a's shape and dtype.
template <typename Act>
void Backward(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& da,
              const torch::Tensor& db, const torch::Tensor& h = torch::Tensor()) {
#ifdef TIGON_CUDA_KERNELS
  if (a.is_cuda()) return BackwardCuda<Act>(dy.to(a.scalar_type()), a, b, da, db, h);
#endif
  BackwardCpu<Act>(dy, a, b, da, db, h);
}

// ---- autograd function ----------------------------------------------------------------------------------

// Self: the named function below (autograd names the node after it).
template <typename Act, typename Self>
class GluFunction : public torch::autograd::Function<Self> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    CheckInputs(Act::kName, a, b);
    c10::OptionalDeviceGuard guard(a.device());
    ctx->save_for_backward({a, b});
#ifdef TIGON_CUDA_KERNELS
    if (a.is_cuda()) return ForwardCuda<Act>(a, b);
#endif
    return ForwardCpu<Act>(a, b);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    c10::OptionalDeviceGuard guard(a.device());
    auto da = torch::empty(a.sizes(), a.options());
    auto db = torch::empty_like(da);
    Backward<Act>(grad_outputs[0], a, saved[1], da, db);
    return {da, db};
  }
};

class SwiGLUFunction : public GluFunction<SiLU, SwiGLUFunction> {};
class GeGLUFunction : public GluFunction<GeluTanh, GeGLUFunction> {};

torch::Tensor SwiGLUOp(const torch::Tensor& a, const torch::Tensor& b) {
  return SwiGLUFunction::apply(a, b);
}

torch::Tensor GeGLUOp(const torch::Tensor& a, const torch::Tensor& b) {
  return GeGLUFunction::apply(a, b);
}

template <typename Act>
void GluBackwardOut(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& da,
                    const torch::Tensor& db, const torch::Tensor& h) {
  CheckBackwardOperands(Act::kName, dy, a, b, da, db, h);
  c10::OptionalDeviceGuard guard(a.device());
  torch::NoGradGuard no_grad;
  Backward<Act>(dy, a, b, da, db, h);
}

}  // namespace

torch::Tensor swiglu(const torch::Tensor& a, const torch::Tensor& b) {
  return SwiGLUOp(a, b);
}

torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b) {
  return GeGLUOp(a, b);
}

void swiglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  GluBackwardOut<SiLU>(dy, a, b, da, db, h);
}

void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  GluBackwardOut<GeluTanh>(dy, a, b, da, db, h);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("swiglu(Tensor a, Tensor b) -> Tensor");
  m.def("geglu(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("swiglu", &tigon::ops::SwiGLUOp);
  m.impl("geglu", &tigon::ops::GeGLUOp);
}
