// GeGLU, gelu_tanh(a) * b (GELU with approximate="tanh"), as an autograd function (GeGLUFunction).
// CUDA tensors go to kernels/cuda/geglu.cu; CPU tensors run the same math here in fp32 (float64 for float64
// inputs), rounded once.
// Saved: a and b. Backward recomputes the activation instead of keeping it.
// geglu_backward_out is the same backward outside autograd, into given outputs that may be the incoming
// gradient itself (written in place): glu_linear uses it to put da over a gradient it owns.
#include "kernels/cuda/geglu.h"

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/glu_checks.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// u = sqrt(2/pi) (a + 0.044715 a^3).
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

torch::ScalarType AccumulateType(torch::ScalarType t) {
  return t == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// ---- CPU fused path -------------------------------------------------------------------------------------

// gelu_tanh(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2u): the sigmoid form (as in the CUDA kernel) has no
// cancellation in 1 + tanh(u) for large negative a.
torch::Tensor GeGLUForwardCpu(const torch::Tensor& a, const torch::Tensor& b) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc);
  auto s = torch::sigmoid(2.0 * kSqrt2OverPi * (af + kCubic * af * af * af));
  return (af * s * b.to(acc)).to(a.scalar_type());
}

// gelu'(a) = s + 2 a s (1 - s) u'(a), s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 a^2).
// da and db may be dy, a or b themselves: both are computed in full before either is stored.
void GeGLUBackwardCpu(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                      const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc), bf = b.to(acc), dyf = dy.to(acc);
  auto s = torch::sigmoid(2.0 * kSqrt2OverPi * (af + kCubic * af * af * af));
  auto gelu_grad = s + 2.0 * af * s * (1.0 - s) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * af * af);
  auto da_acc = dyf * bf * gelu_grad;
  auto db_acc = dyf * af * s;
  // h: the forward's products in the forward's order, so it equals the forward's output.
  torch::Tensor h_acc = h.defined() ? af * s * bf : torch::Tensor();
  da.copy_(da_acc);
  db.copy_(db_acc);
  if (h.defined()) h.copy_(h_acc);
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
torch::Tensor AsRows(const torch::Tensor& t) {
  auto rows = t.reshape({-1, t.size(-1)});
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

cuda::GluOperand Operand(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}
cuda::GluOutput Output(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}

torch::Tensor GeGLUForwardCuda(const torch::Tensor& a, const torch::Tensor& b) {
  auto a2d = AsRows(a), b2d = AsRows(b);
  auto y = torch::empty({a2d.size(0), a2d.size(1)}, a.options());
  if (y.numel() == 0) return y.view(a.sizes());
  cuda::GluForwardParams p;
  p.a = Operand(a2d);
  p.b = Operand(b2d);
  p.y = Output(y);
  p.rows = a2d.size(0);
  p.cols = a2d.size(1);
  p.dtype = CudaDType(a);
  CheckLaunch(cuda::geglu_forward(p, CurrentCudaStream(a.device())), "geglu_forward");
  return y.view(a.sizes());
}

// dy in a's dtype; da and db contiguous (the kernel reads every element before writing it, so either may be
// dy, a or b).
void GeGLUBackwardCuda(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                       const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  if (da.numel() == 0) return;
  const int64_t cols = a.size(-1);
  auto a2d = AsRows(a), b2d = AsRows(b), dy2d = AsRows(dy);
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
  CheckLaunch(cuda::geglu_backward(p, CurrentCudaStream(a.device())), "geglu_backward");
}
#endif  // TIGON_CUDA_KERNELS

// da, db: contiguous, a's shape and dtype.
void GeGLUBackward(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& da,
                   const torch::Tensor& db, const torch::Tensor& h = torch::Tensor()) {
#ifdef TIGON_CUDA_KERNELS
  if (a.is_cuda()) return GeGLUBackwardCuda(dy.to(a.scalar_type()), a, b, da, db, h);
#endif
  GeGLUBackwardCpu(dy, a, b, da, db, h);
}

// ---- autograd function ----------------------------------------------------------------------------------

class GeGLUFunction : public torch::autograd::Function<GeGLUFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    detail::CheckGluInputs("geglu", a, b);
    c10::OptionalDeviceGuard guard(a.device());
    ctx->save_for_backward({a, b});
#ifdef TIGON_CUDA_KERNELS
    if (a.is_cuda()) return GeGLUForwardCuda(a, b);
#endif
    return GeGLUForwardCpu(a, b);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    c10::OptionalDeviceGuard guard(a.device());
    auto da = torch::empty(a.sizes(), a.options());
    auto db = torch::empty_like(da);
    GeGLUBackward(grad_outputs[0], a, saved[1], da, db);
    return {da, db};
  }
};

torch::Tensor GeGLUOp(const torch::Tensor& a, const torch::Tensor& b) {
  return GeGLUFunction::apply(a, b);
}

}  // namespace

torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b) {
  return GeGLUOp(a, b);
}

void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h) {
  detail::CheckGluBackwardOperands("geglu", dy, a, b, da, db, h);
  c10::OptionalDeviceGuard guard(a.device());
  torch::NoGradGuard no_grad;
  GeGLUBackward(dy, a, b, da, db, h);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("geglu(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("geglu", &tigon::ops::GeGLUOp);
}
