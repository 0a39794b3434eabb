// RMSNorm and residual-add + RMSNorm as autograd functions (RMSNormFunction, AddRMSNormFunction), and the
// passes without autograd that they and rms_norm_linears.cpp share (rms_norm.h).
// CUDA tensors go to kernels/cuda/rms_norm.cu; CPU tensors run the same fused math here, over blocks of
// rows with ATen ops in fp32 (float64 for float64 inputs).
// Saved: the normalised input (x, or residual_out = x + residual), the weight and the per-row rstd.
// Backward recomputes x_hat = h * rstd; dweight is reduced in two stages (per-block partial sums, then a
// sum over blocks) so that it does not depend on thread count or scheduling.
// Output dtype follows Hugging Face: kGemma returns x's dtype, the other modes promote(x, weight).
#include "kernels/cuda/rms_norm.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/op_helpers.h"
#include "kernels/ops/ops.h"
#include "kernels/ops/rms_norm.h"

namespace tigon::ops {
namespace detail {

RMSNormCasting ToRMSNormCasting(int64_t casting) {
  TORCH_CHECK(casting >= 0 && casting <= 2, "tigon::rms_norm: casting must be 0 (llama), 1 (gemma) or 2 (none), got ",
              casting);
  return static_cast<RMSNormCasting>(casting);
}

torch::ScalarType RMSNormOutputType(torch::ScalarType x, torch::ScalarType weight, RMSNormCasting casting) {
  return casting == RMSNormCasting::kGemma ? x : torch::promote_types(x, weight);
}

void CheckRMSNormInputs(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "tigon::rms_norm: x needs at least one dim");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "tigon::rms_norm: weight must be [", x.size(-1),
              "], got ", weight.sizes());
  TORCH_CHECK(weight.device() == x.device(), "tigon::rms_norm: x and weight on different devices");
}

}  // namespace detail

namespace {

using detail::RMSNormOutputType;

// Rows per CPU task; also the rows summed into one partial of dweight (fixed, hence deterministic).
constexpr int64_t kCpuRowBlock = 64;

// The weight as the kernels multiply by it: kLlama and kNone add the offset in the weight's dtype (as
// Hugging Face's `offset + weight` does), kGemma in fp32.
torch::Tensor EffectiveWeight(const torch::Tensor& weight, double offset, RMSNormCasting casting,
                              torch::ScalarType acc) {
  if (casting == RMSNormCasting::kGemma) return weight.to(acc) + offset;
  return (offset == 0.0 ? weight : weight + offset).to(acc);
}

// ---- CPU fused path -------------------------------------------------------------------------------------

// y = normalise(h) * weight, rstd per row. h2d: [rows, hidden].
std::pair<torch::Tensor, torch::Tensor> RMSNormForwardCpu(const torch::Tensor& h2d, const torch::Tensor& weight,
                                                          double eps, double offset, RMSNormCasting casting) {
  const auto acc = AccumulateType(h2d.scalar_type());
  const int64_t rows = h2d.size(0), hidden = h2d.size(1);
  const auto out_type = RMSNormOutputType(h2d.scalar_type(), weight.scalar_type(), casting);
  auto y = torch::empty({rows, hidden}, h2d.options().dtype(out_type));
  auto rstd = torch::empty({rows}, h2d.options().dtype(acc));
  // kLlama multiplies in the promoted dtype by the weight as stored; the others in fp32.
  const auto w_llama = offset == 0.0 ? weight : weight + offset;
  const auto w_acc = EffectiveWeight(weight, offset, casting, acc);
  at::parallel_for(0, rows, kCpuRowBlock, [&](int64_t begin, int64_t end) {
    auto hb = h2d.slice(0, begin, end).to(acc);
    auto r = torch::rsqrt(hb.pow(2).mean(-1, /*keepdim=*/true) + eps);
    rstd.slice(0, begin, end).copy_(r.squeeze(-1));
    auto x_hat = hb * r;
    if (casting == RMSNormCasting::kLlama) {
      y.slice(0, begin, end).copy_(w_llama * x_hat.to(h2d.scalar_type()));
    } else {
      y.slice(0, begin, end).copy_(x_hat * w_acc);
    }
  });
  return {y, rstd};
}

// (dh, dweight) from dy, the normalised input h and its rstd; d_residual_out (optional, [rows, hidden]) is
// added before dh is rounded to its dtype, as the CUDA kernel does.
std::pair<torch::Tensor, torch::Tensor> RMSNormBackwardCpu(const torch::Tensor& dy2d, const torch::Tensor& h2d,
                                                           const torch::Tensor& d_residual_out,
                                                           const torch::Tensor& weight, const torch::Tensor& rstd,
                                                           double offset, RMSNormCasting casting) {
  const auto acc = AccumulateType(h2d.scalar_type());
  const int64_t rows = h2d.size(0), hidden = h2d.size(1);
  const int64_t num_blocks = (rows + kCpuRowBlock - 1) / kCpuRowBlock;
  auto dh = torch::empty({rows, hidden}, h2d.options());
  auto partials = torch::zeros({std::max<int64_t>(num_blocks, 1), hidden}, h2d.options().dtype(acc));
  const auto w_acc = EffectiveWeight(weight, offset, casting, acc);
  at::parallel_for(0, num_blocks, 1, [&](int64_t first_block, int64_t last_block) {
    for (int64_t block = first_block; block < last_block; ++block) {
      const int64_t begin = block * kCpuRowBlock, end = std::min(rows, begin + kCpuRowBlock);
      auto hb = h2d.slice(0, begin, end).to(acc);
      auto dyb = dy2d.slice(0, begin, end).to(acc);
      auto r = rstd.slice(0, begin, end).to(acc).unsqueeze(-1);
      auto x_hat = hb * r;
      auto g = dyb * w_acc;
      auto dhb = r * (g - x_hat * (g * x_hat).mean(-1, /*keepdim=*/true));
      if (d_residual_out.defined()) dhb = dhb + d_residual_out.slice(0, begin, end).to(acc);
      dh.slice(0, begin, end).copy_(dhb);
      // kLlama's weight multiplies x_hat rounded to the input dtype; its gradient sees the same rounding.
      auto x_hat_w = casting == RMSNormCasting::kLlama ? x_hat.to(h2d.scalar_type()).to(acc) : x_hat;
      partials[block].copy_((dyb * x_hat_w).sum(0));
    }
  });
  return {dh, partials.sum(0).to(weight.scalar_type())};
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
cuda::RMSNormCasting CudaCasting(RMSNormCasting casting) {
  switch (casting) {
    case RMSNormCasting::kLlama: return cuda::RMSNormCasting::kLlama;
    case RMSNormCasting::kGemma: return cuda::RMSNormCasting::kGemma;
    case RMSNormCasting::kNone: return cuda::RMSNormCasting::kNone;
  }
  TORCH_CHECK(false, "tigon::rms_norm: unknown casting mode");
}

void CheckCudaTypes(const torch::Tensor& h, const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == h.scalar_type() || weight.scalar_type() == torch::kFloat,
              "tigon::rms_norm (CUDA): weight must have x's dtype or float32, got ", weight.scalar_type(), " for x ",
              h.scalar_type());
}

// residual2d undefined: plain RMSNorm of x2d. Otherwise h = x2d + residual2d is written to residual_out.
std::pair<torch::Tensor, torch::Tensor> RMSNormForwardCuda(const torch::Tensor& x2d, const torch::Tensor& residual2d,
                                                           const torch::Tensor& residual_out,
                                                           const torch::Tensor& weight, double eps, double offset,
                                                           RMSNormCasting casting) {
  CheckCudaTypes(x2d, weight);
  const int64_t rows = x2d.size(0), hidden = x2d.size(1);
  const auto out_type = RMSNormOutputType(x2d.scalar_type(), weight.scalar_type(), casting);
  auto y = torch::empty({rows, hidden}, x2d.options().dtype(out_type));
  auto rstd = torch::empty({rows}, x2d.options().dtype(torch::kFloat));
  if (rows == 0 || hidden == 0) return {y, rstd};
  const auto w = weight.contiguous();
  cuda::RMSNormForwardParams p;
  p.x = x2d.data_ptr();
  p.x_row_stride = x2d.stride(0);
  if (residual2d.defined()) {
    p.residual = residual2d.data_ptr();
    p.residual_row_stride = residual2d.stride(0);
    p.residual_out = residual_out.data_ptr();
    p.residual_out_row_stride = residual_out.stride(0);
  }
  p.weight = w.data_ptr();
  p.y = y.data_ptr();
  p.y_row_stride = y.stride(0);
  p.rstd = rstd.data_ptr<float>();
  p.rows = rows;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  p.offset = static_cast<float>(offset);
  p.casting = CudaCasting(casting);
  p.x_dtype = CudaDType(x2d);
  p.weight_dtype = CudaDType(w);
  p.y_dtype = CudaDType(y);
  CheckLaunch(cuda::rms_norm_forward(p, CurrentCudaStream(x2d.device())), "rms_norm_forward");
  return {y, rstd};
}

// d_residual_out undefined for plain RMSNorm; otherwise it is added into dh.
std::pair<torch::Tensor, torch::Tensor> RMSNormBackwardCuda(const torch::Tensor& dy2d, const torch::Tensor& h2d,
                                                            const torch::Tensor& d_residual_out,
                                                            const torch::Tensor& weight, const torch::Tensor& rstd,
                                                            double offset, RMSNormCasting casting) {
  const int64_t rows = h2d.size(0), hidden = h2d.size(1);
  auto dh = torch::empty({rows, hidden}, h2d.options());
  if (rows == 0 || hidden == 0) return {dh, torch::zeros_like(weight)};
  const auto w = weight.contiguous();
  auto dweight = torch::empty({hidden}, w.options());
  auto partials =
      torch::empty({cuda::rms_norm_backward_num_partials(rows), hidden}, h2d.options().dtype(torch::kFloat));
  auto dy = dy2d.scalar_type() == RMSNormOutputType(h2d.scalar_type(), w.scalar_type(), casting)
                ? dy2d
                : dy2d.to(RMSNormOutputType(h2d.scalar_type(), w.scalar_type(), casting));
  cuda::RMSNormBackwardParams p;
  p.dy = dy.data_ptr();
  p.dy_row_stride = dy.stride(0);
  p.x = h2d.data_ptr();
  p.x_row_stride = h2d.stride(0);
  if (d_residual_out.defined()) {
    p.d_residual_out = d_residual_out.data_ptr();
    p.d_residual_out_row_stride = d_residual_out.stride(0);
  }
  p.weight = w.data_ptr();
  p.rstd = rstd.data_ptr<float>();
  p.dx = dh.data_ptr();
  p.dx_row_stride = dh.stride(0);
  p.dweight = dweight.data_ptr();
  p.dweight_partials = partials.data_ptr<float>();
  p.rows = rows;
  p.hidden = hidden;
  p.offset = static_cast<float>(offset);
  p.casting = CudaCasting(casting);
  p.x_dtype = CudaDType(h2d);
  p.weight_dtype = CudaDType(w);
  p.dy_dtype = CudaDType(dy);
  CheckLaunch(cuda::rms_norm_backward(p, CurrentCudaStream(h2d.device())), "rms_norm_backward");
  return {dh, dweight};
}
#endif  // TIGON_CUDA_KERNELS

}  // namespace

namespace detail {

std::pair<torch::Tensor, torch::Tensor> RMSNormForward(const torch::Tensor& h2d, const torch::Tensor& weight,
                                                       double eps, double offset, RMSNormCasting casting) {
#ifdef TIGON_CUDA_KERNELS
  if (h2d.is_cuda()) return RMSNormForwardCuda(h2d, {}, {}, weight, eps, offset, casting);
#endif
  return RMSNormForwardCpu(h2d, weight, eps, offset, casting);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormBackward(const torch::Tensor& dy2d, const torch::Tensor& h2d,
                                                        const torch::Tensor& d_residual_out,
                                                        const torch::Tensor& weight, const torch::Tensor& rstd,
                                                        double offset, RMSNormCasting casting) {
#ifdef TIGON_CUDA_KERNELS
  if (h2d.is_cuda()) {
    return RMSNormBackwardCuda(AsRows(dy2d, h2d.size(1)), h2d,
                               d_residual_out.defined() ? AsRows(d_residual_out, h2d.size(1)) : d_residual_out, weight,
                               rstd, offset, casting);
  }
#endif
  return RMSNormBackwardCpu(dy2d, h2d, d_residual_out.defined() ? AsRows(d_residual_out, h2d.size(1)) : d_residual_out,
                            weight, rstd, offset, casting);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> AddRMSNormForward(const torch::Tensor& x,
                                                                          const torch::Tensor& residual,
                                                                          const torch::Tensor& weight, double eps,
                                                                          double offset, RMSNormCasting mode) {
  const int64_t hidden = x.size(-1);
  torch::Tensor h2d, y, rstd;
#ifdef TIGON_CUDA_KERNELS
  if (x.is_cuda()) {
    TORCH_CHECK(residual.scalar_type() == x.scalar_type(), "tigon::add_rms_norm (CUDA): x is ", x.scalar_type(),
                ", residual is ", residual.scalar_type());
    auto x2d = AsRows(x, hidden);
    h2d = torch::empty({x2d.size(0), hidden}, x2d.options());
    std::tie(y, rstd) = RMSNormForwardCuda(x2d, AsRows(residual, hidden), h2d, weight, eps, offset, mode);
    return {h2d, y, rstd};
  }
#endif
  h2d = AsRows(x + residual, hidden);
  std::tie(y, rstd) = RMSNormForwardCpu(h2d, weight, eps, offset, mode);
  return {h2d, y, rstd};
}

}  // namespace detail

namespace {

using detail::AddRMSNormForward;
using detail::CheckRMSNormInputs;
using detail::RMSNormBackward;
using detail::RMSNormForward;
using detail::ToRMSNormCasting;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// ---- autograd functions ---------------------------------------------------------------------------------

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               double offset, int64_t casting) {
    CheckRMSNormInputs(x, weight);
    c10::OptionalDeviceGuard guard(x.device());
    const int64_t hidden = x.size(-1);
    auto x2d = AsRows(x, hidden);
    auto [y, rstd] = RMSNormForward(x2d, weight, eps, offset, ToRMSNormCasting(casting));
    ctx->save_for_backward({x2d, weight, rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting"] = casting;
    return y.view(x.sizes());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2d = saved[0];
    const auto& weight = saved[1];
    const auto& rstd = saved[2];
    c10::OptionalDeviceGuard guard(x2d.device());
    const auto input_sizes = grad_outputs[0].sizes().vec();
    auto [dx, dweight] =
        RMSNormBackward(AsRows(grad_outputs[0], x2d.size(1)), x2d, {}, weight, rstd,
                        ctx->saved_data["offset"].toDouble(), ToRMSNormCasting(ctx->saved_data["casting"].toInt()));
    return {dx.view(input_sizes), dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class AddRMSNormFunction : public torch::autograd::Function<AddRMSNormFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& residual,
                             const torch::Tensor& weight, double eps, double offset, int64_t casting) {
    CheckRMSNormInputs(x, weight);
    TORCH_CHECK(x.sizes() == residual.sizes(), "tigon::add_rms_norm: x ", x.sizes(), " and residual ", residual.sizes(),
                " differ");
    c10::OptionalDeviceGuard guard(x.device());
    auto [residual_out, y, rstd] = AddRMSNormForward(x, residual, weight, eps, offset, ToRMSNormCasting(casting));
    ctx->save_for_backward({residual_out, weight, rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting"] = casting;
    return {y.view(x.sizes()), residual_out.view(x.sizes())};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& h2d = saved[0];
    const auto& weight = saved[1];
    const auto& rstd = saved[2];
    c10::OptionalDeviceGuard guard(h2d.device());
    const auto input_sizes = grad_outputs[0].sizes().vec();
    auto [dh, dweight] =
        RMSNormBackward(AsRows(grad_outputs[0], h2d.size(1)), h2d, grad_outputs[1], weight, rstd,
                        ctx->saved_data["offset"].toDouble(), ToRMSNormCasting(ctx->saved_data["casting"].toInt()));
    auto dh_view = dh.view(input_sizes);
    return {dh_view, dh_view, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor RMSNormOp(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                        int64_t casting) {
  return RMSNormFunction::apply(x, weight, eps, offset, casting);
}

std::tuple<torch::Tensor, torch::Tensor> AddRMSNormOp(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps, double offset,
                                                      int64_t casting) {
  auto outputs = AddRMSNormFunction::apply(x, residual, weight, eps, offset, casting);
  return {outputs[0], outputs[1]};
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                       RMSNormCasting casting) {
  return RMSNormOp(x, weight, eps, offset, static_cast<int64_t>(casting));
}

std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps, double offset,
                                                      RMSNormCasting casting) {
  return AddRMSNormOp(x, residual, weight, eps, offset, static_cast<int64_t>(casting));
}

}  // namespace tigon::ops

// casting: 0 = Llama, 1 = Gemma, 2 = none (tigon::RMSNormCasting).
TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, float offset, int casting) -> Tensor");
  m.def(
      "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, float offset, int casting) "
      "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("rms_norm", &tigon::ops::RMSNormOp);
  m.impl("add_rms_norm", &tigon::ops::AddRMSNormOp);
}
