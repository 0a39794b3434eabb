// RMSNorm and residual-add + RMSNorm as autograd functions (RMSNormFunction, AddRMSNormFunction).
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
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per CPU task; also the rows summed into one partial of dweight (fixed, hence deterministic).
constexpr int64_t kCpuRowBlock = 64;

torch::ScalarType AccumulateType(torch::ScalarType t) {
  return t == torch::kDouble ? torch::kDouble : torch::kFloat;
}

RMSNormCasting ToCasting(int64_t casting) {
  TORCH_CHECK(casting >= 0 && casting <= 2, "tigon::rms_norm: casting must be 0 (llama), 1 (gemma) or 2 (none), got ",
              casting);
  return static_cast<RMSNormCasting>(casting);
}

torch::ScalarType OutputType(torch::ScalarType x, torch::ScalarType weight, RMSNormCasting casting) {
  return casting == RMSNormCasting::kGemma ? x : torch::promote_types(x, weight);
}

// [rows, hidden] with unit stride over hidden: a view where the layout allows it, else a contiguous copy.
torch::Tensor AsRows(const torch::Tensor& t, int64_t hidden) {
  auto rows = t.reshape({-1, hidden});
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

void CheckInputs(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1, "tigon::rms_norm: x needs at least one dim");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "tigon::rms_norm: weight must be [", x.size(-1),
              "], got ", weight.sizes());
  TORCH_CHECK(weight.device() == x.device(), "tigon::rms_norm: x and weight on different devices");
}

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
  auto y =
      torch::empty({rows, hidden}, h2d.options().dtype(OutputType(h2d.scalar_type(), weight.scalar_type(), casting)));
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
  auto y =
      torch::empty({rows, hidden}, x2d.options().dtype(OutputType(x2d.scalar_type(), weight.scalar_type(), casting)));
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
  p.casting = casting;
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
  auto dy = dy2d.scalar_type() == OutputType(h2d.scalar_type(), w.scalar_type(), casting)
                ? dy2d
                : dy2d.to(OutputType(h2d.scalar_type(), w.scalar_type(), casting));
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
  p.casting = casting;
  p.x_dtype = CudaDType(h2d);
  p.weight_dtype = CudaDType(w);
  p.dy_dtype = CudaDType(dy);
  CheckLaunch(cuda::rms_norm_backward(p, CurrentCudaStream(h2d.device())), "rms_norm_backward");
  return {dh, dweight};
}
#endif  // TIGON_CUDA_KERNELS

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

// h = x + residual stored in x's dtype, then (h [rows, hidden], y = rms_norm(h), rstd): Hugging Face
// normalises the rounded sum, and so do both paths.
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

// ---- autograd functions ---------------------------------------------------------------------------------

class RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               double offset, int64_t casting) {
    CheckInputs(x, weight);
    c10::OptionalDeviceGuard guard(x.device());
    const int64_t hidden = x.size(-1);
    auto x2d = AsRows(x, hidden);
    auto [y, rstd] = RMSNormForward(x2d, weight, eps, offset, ToCasting(casting));
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
                        ctx->saved_data["offset"].toDouble(), ToCasting(ctx->saved_data["casting"].toInt()));
    return {dx.view(input_sizes), dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class AddRMSNormFunction : public torch::autograd::Function<AddRMSNormFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& residual,
                             const torch::Tensor& weight, double eps, double offset, int64_t casting) {
    CheckInputs(x, weight);
    TORCH_CHECK(x.sizes() == residual.sizes(), "tigon::add_rms_norm: x ", x.sizes(), " and residual ", residual.sizes(),
                " differ");
    c10::OptionalDeviceGuard guard(x.device());
    auto [residual_out, y, rstd] = AddRMSNormForward(x, residual, weight, eps, offset, ToCasting(casting));
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
                        ctx->saved_data["offset"].toDouble(), ToCasting(ctx->saved_data["casting"].toInt()));
    auto dh_view = dh.view(input_sizes);
    return {dh_view, dh_view, dweight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Projections of an RMSNorm's output, linear(rms_norm(h), w_i, b_i) for up to three (w_i, b_i), with
// h = x, or h = x + residual when residual is given (then h is returned last). An absent residual,
// weight or bias is an empty tensor (autograd functions take no undefined inputs). Saves h, the weights and
// rstd but not rms_norm(h): backward recomputes it with the forward kernel (bit-identical, as h and rstd
// are), so the projections' shared input costs no memory between forward and backward.
// Backward memory beyond the saved tensors and the incoming gradients (T rows, hidden H, out features O_i):
// y = rms_norm(h) lives only while the weight gradients are taken, then dy = sum_i g_i @ w_i (accumulated in
// one buffer with addmm_) and dh: 2 T H + sum_i O_i H (the weight gradients). Keeping y until dh was
// computed held 3 T H + sum_i O_i H. Llama-3-8B at T = 32768 (H = 4096, bf16): 0.5 GiB instead of 0.75 GiB
// of [T, H] buffers.
class RMSNormLinearsFunction : public torch::autograd::Function<RMSNormLinearsFunction> {
 public:
  static bool Given(const torch::Tensor& t) { return t.defined() && t.numel() > 0; }

  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& residual,
                             const torch::Tensor& weight, const torch::Tensor& w0, const torch::Tensor& w1,
                             const torch::Tensor& w2, const torch::Tensor& b0, const torch::Tensor& b1,
                             const torch::Tensor& b2, double eps, double offset, int64_t casting) {
    CheckInputs(x, weight);
    c10::OptionalDeviceGuard guard(x.device());
    const int64_t hidden = x.size(-1);
    const auto mode = ToCasting(casting);
    torch::Tensor h2d, y, rstd;
    const bool has_residual = Given(residual);
    if (has_residual) {
      TORCH_CHECK(x.sizes() == residual.sizes(), "tigon::rms_norm_linears: x ", x.sizes(), " and residual ",
                  residual.sizes(), " differ");
      std::tie(h2d, y, rstd) = AddRMSNormForward(x, residual, weight, eps, offset, mode);
    } else {
      h2d = AsRows(x, hidden);
      std::tie(y, rstd) = RMSNormForward(h2d, weight, eps, offset, mode);
    }
    auto lead = x.sizes().vec();
    lead.pop_back();
    tensor_list outputs;
    for (const auto& [w, b] : {std::pair{w0, b0}, std::pair{w1, b1}, std::pair{w2, b2}}) {
      if (!Given(w)) continue;
      auto shape = lead;
      shape.push_back(w.size(0));
      outputs.push_back((Given(b) ? at::linear(y, w, b) : at::linear(y, w)).view(shape));
    }
    if (has_residual) outputs.push_back(h2d.view(x.sizes()));
    ctx->save_for_backward({h2d, weight, rstd, w0, w1, w2});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting"] = casting;
    ctx->saved_data["has_residual"] = has_residual;
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["bias_mask"] = static_cast<int64_t>(Given(b0)) | (static_cast<int64_t>(Given(b1)) << 1) |
                                   (static_cast<int64_t>(Given(b2)) << 2);
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& h2d = saved[0];
    const auto& weight = saved[1];
    const auto& rstd = saved[2];
    c10::OptionalDeviceGuard guard(h2d.device());
    const double offset = ctx->saved_data["offset"].toDouble();
    const auto mode = ToCasting(ctx->saved_data["casting"].toInt());
    const bool has_residual = ctx->saved_data["has_residual"].toBool();
    const int64_t bias_mask = ctx->saved_data["bias_mask"].toInt();
    // Projection i's incoming gradient (undefined where the projection is absent or its output unused).
    tensor_list grads(3);
    size_t output = 0;
    bool weight_grads = false;
    for (int i = 0; i < 3; ++i) {
      if (!Given(saved[3 + i])) continue;
      grads[i] = grad_outputs[output++];
      weight_grads = weight_grads || (grads[i].defined() && ctx->needs_input_grad(3 + i));
    }
    const torch::Tensor d_residual_out = has_residual ? grad_outputs[output] : torch::Tensor();
    auto rows_of = [&](int i) { return grads[i].reshape({-1, saved[3 + i].size(0)}); };
    // The weight gradients first, while the recomputed y lives; it is freed before dy and dh exist.
    tensor_list dw(3), db(3);
    if (weight_grads) {
      const auto y = RMSNormForward(h2d, weight, ctx->saved_data["eps"].toDouble(), offset, mode).first;
      for (int i = 0; i < 3; ++i) {
        if (grads[i].defined() && ctx->needs_input_grad(3 + i)) dw[i] = rows_of(i).t().mm(y);
      }
    }
    // dy = sum_i g_i @ w_i, accumulated into one buffer. One rounding per projection: cuBLAS accumulates
    // beta * dy in fp32.
    torch::Tensor dy;
    for (int i = 0; i < 3; ++i) {
      if (!grads[i].defined()) continue;
      const auto g2d = rows_of(i);
      if (bias_mask & (1 << i)) db[i] = g2d.sum(0);
      if (dy.defined()) {
        dy.addmm_(g2d, saved[3 + i]);
      } else {
        dy = g2d.mm(saved[3 + i]);
      }
    }
    if (!dy.defined()) {
      dy = torch::zeros({h2d.size(0), h2d.size(1)},
                        h2d.options().dtype(OutputType(h2d.scalar_type(), weight.scalar_type(), mode)));
    }
    auto [dh, dweight] = RMSNormBackward(dy, h2d, d_residual_out, weight, rstd, offset, mode);
    const auto dx = dh.view(ctx->saved_data["sizes"].toIntVector());
    return {dx, has_residual ? dx : torch::Tensor(), dweight, dw[0], dw[1], dw[2], db[0], db[1], db[2],
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
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

std::vector<torch::Tensor> rms_norm_linears(const torch::Tensor& x, const torch::Tensor& residual,
                                            const torch::Tensor& weight, double eps, double offset,
                                            RMSNormCasting casting, const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases) {
  TORCH_CHECK(!weights.empty() && weights.size() <= 3, "tigon::rms_norm_linears: takes 1 to 3 weights, got ",
              weights.size());
  TORCH_CHECK(biases.empty() || biases.size() == weights.size(),
              "tigon::rms_norm_linears: give one bias (or an undefined tensor) per weight, or none");
  TORCH_CHECK(x.defined(), "tigon::rms_norm_linears: x is undefined");
  const torch::Tensor none = torch::empty({0}, x.options());
  torch::Tensor w[3] = {none, none, none}, b[3] = {none, none, none};
  for (size_t i = 0; i < weights.size(); ++i) {
    TORCH_CHECK(weights[i].defined() && weights[i].dim() == 2 && weights[i].size(0) > 0 &&
                    weights[i].size(1) == x.size(-1),
                "tigon::rms_norm_linears: weight ", i, " must be [out, ", x.size(-1), "]");
    w[i] = weights[i];
    if (!biases.empty() && biases[i].defined()) b[i] = biases[i];
  }
  return RMSNormLinearsFunction::apply(x, residual.defined() ? residual : none, weight, w[0], w[1], w[2], b[0], b[1],
                                       b[2], eps, offset, static_cast<int64_t>(casting));
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
