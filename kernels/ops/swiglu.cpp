// SwiGLU, silu(a) * b, as an autograd function (SwiGLUFunction). CUDA tensors go to kernels/cuda/swiglu.cu;
// CPU tensors run the same math here in fp32 (float64 for float64 inputs), rounded once.
// Saved: a and b. Backward recomputes sigmoid(a) instead of keeping the activation.
#include "kernels/cuda/swiglu.h"

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

torch::ScalarType AccumulateType(torch::ScalarType t) {
  return t == torch::kDouble ? torch::kDouble : torch::kFloat;
}

void CheckInputs(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 1, "tigon::swiglu: a needs at least one dim");
  TORCH_CHECK(a.sizes() == b.sizes(), "tigon::swiglu: a ", a.sizes(), " and b ", b.sizes(), " differ");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "tigon::swiglu: a is ", a.scalar_type(), ", b is ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "tigon::swiglu: a and b on different devices");
}

torch::Tensor AsRows(const torch::Tensor& t) {
  auto rows = t.reshape({-1, t.size(-1)});
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

// ---- CPU fused path -------------------------------------------------------------------------------------

torch::Tensor SwiGLUForwardCpu(const torch::Tensor& a, const torch::Tensor& b) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc);
  return (af * torch::sigmoid(af) * b.to(acc)).to(a.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> SwiGLUBackwardCpu(const torch::Tensor& dy, const torch::Tensor& a,
                                                          const torch::Tensor& b) {
  const auto acc = AccumulateType(a.scalar_type());
  auto af = a.to(acc), bf = b.to(acc), dyf = dy.to(acc);
  auto s = torch::sigmoid(af);
  auto da = dyf * bf * s * (1.0 + af * (1.0 - s));
  auto db = dyf * af * s;
  return {da.to(a.scalar_type()), db.to(b.scalar_type())};
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
cuda::GluOperand Operand(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}
cuda::GluOutput Output(const torch::Tensor& t) {
  return {t.data_ptr(), t.stride(0)};
}

torch::Tensor SwiGLUForwardCuda(const torch::Tensor& a, const torch::Tensor& b) {
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
  CheckLaunch(cuda::swiglu_forward(p, CurrentCudaStream(a.device())), "swiglu_forward");
  return y.view(a.sizes());
}

std::pair<torch::Tensor, torch::Tensor> SwiGLUBackwardCuda(const torch::Tensor& dy, const torch::Tensor& a,
                                                           const torch::Tensor& b) {
  auto a2d = AsRows(a), b2d = AsRows(b), dy2d = AsRows(dy);
  auto da = torch::empty({a2d.size(0), a2d.size(1)}, a.options());
  auto db = torch::empty_like(da);
  if (da.numel() == 0) return {da.view(a.sizes()), db.view(a.sizes())};
  cuda::GluBackwardParams p;
  p.dy = Operand(dy2d);
  p.a = Operand(a2d);
  p.b = Operand(b2d);
  p.da = Output(da);
  p.db = Output(db);
  p.rows = a2d.size(0);
  p.cols = a2d.size(1);
  p.dtype = CudaDType(a);
  CheckLaunch(cuda::swiglu_backward(p, CurrentCudaStream(a.device())), "swiglu_backward");
  return {da.view(a.sizes()), db.view(a.sizes())};
}
#endif  // TIGON_CUDA_KERNELS

// ---- autograd function ----------------------------------------------------------------------------------

class SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b) {
    CheckInputs(a, b);
    c10::OptionalDeviceGuard guard(a.device());
    ctx->save_for_backward({a, b});
#ifdef TIGON_CUDA_KERNELS
    if (a.is_cuda()) return SwiGLUForwardCuda(a, b);
#endif
    return SwiGLUForwardCpu(a, b);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    c10::OptionalDeviceGuard guard(saved[0].device());
    const auto& dy = grad_outputs[0];
#ifdef TIGON_CUDA_KERNELS
    if (dy.is_cuda()) {
      auto [da, db] = SwiGLUBackwardCuda(dy.to(saved[0].scalar_type()), saved[0], saved[1]);
      return {da, db};
    }
#endif
    auto [da, db] = SwiGLUBackwardCpu(dy, saved[0], saved[1]);
    return {da, db};
  }
};

torch::Tensor SwiGLUOp(const torch::Tensor& a, const torch::Tensor& b) {
  return SwiGLUFunction::apply(a, b);
}

}  // namespace

torch::Tensor swiglu(const torch::Tensor& a, const torch::Tensor& b) {
  return SwiGLUOp(a, b);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("swiglu(Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("swiglu", &tigon::ops::SwiGLUOp);
}
