// rms_norm_linears: linear(rms_norm(h), w_i, b_i) for 1 to 3 projections of one norm (q/k/v, gate/up) as
// one autograd function (RMSNormLinearsFunction), with h = x, or h = x + residual when residual is given
// (then h is returned last). CUDA and CPU tensors take the paths of rms_norm.cpp (rms_norm.h); the
// projections are ATen matmuls.
// Saves h, the weights and rstd but not rms_norm(h): backward recomputes it with the forward pass
// (bit-identical, as h and rstd are), so the projections' shared input costs no memory between forward and
// backward.
// Backward memory beyond the saved tensors and the incoming gradients (T rows, hidden H, out features O_i):
// y = rms_norm(h) lives only while the weight gradients are taken, then dy = sum_i g_i @ w_i (accumulated in
// one buffer with addmm_) and dh: 2 T H + sum_i O_i H (the weight gradients). Keeping y until dh was
// computed held 3 T H + sum_i O_i H. Llama-3-8B at T = 32768 (H = 4096, bf16): 0.5 GiB instead of 0.75 GiB
// of [T, H] buffers.
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/op_helpers.h"
#include "kernels/ops/ops.h"
#include "kernels/ops/rms_norm.h"

namespace tigon::ops {
namespace {

using detail::AddRMSNormForward;
using detail::CheckRMSNormInputs;
using detail::RMSNormBackward;
using detail::RMSNormForward;
using detail::RMSNormOutputType;
using detail::ToRMSNormCasting;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// An absent residual, weight or bias is an empty tensor (autograd functions take no undefined inputs).
class RMSNormLinearsFunction : public torch::autograd::Function<RMSNormLinearsFunction> {
 public:
  static bool Given(const torch::Tensor& t) { return t.defined() && t.numel() > 0; }

  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& residual,
                             const torch::Tensor& weight, const torch::Tensor& w0, const torch::Tensor& w1,
                             const torch::Tensor& w2, const torch::Tensor& b0, const torch::Tensor& b1,
                             const torch::Tensor& b2, double eps, double offset, int64_t casting) {
    CheckRMSNormInputs(x, weight);
    c10::OptionalDeviceGuard guard(x.device());
    const int64_t hidden = x.size(-1);
    const auto mode = ToRMSNormCasting(casting);
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
    const auto mode = ToRMSNormCasting(ctx->saved_data["casting"].toInt());
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
                        h2d.options().dtype(RMSNormOutputType(h2d.scalar_type(), weight.scalar_type(), mode)));
    }
    auto [dh, dweight] = RMSNormBackward(dy, h2d, d_residual_out, weight, rstd, offset, mode);
    const auto dx = dh.view(ctx->saved_data["sizes"].toIntVector());
    return {dx, has_residual ? dx : torch::Tensor(), dweight, dw[0], dw[1], dw[2], db[0], db[1], db[2],
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};


}  // namespace

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

namespace {

// The torch op: residual and each bias optional, as in rms_norm_linears.
std::vector<torch::Tensor> RMSNormLinearsOp(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                            const torch::Tensor& weight, double eps, double offset, int64_t casting,
                                            at::TensorList weights,
                                            const c10::List<c10::optional<torch::Tensor>>& biases) {
  std::vector<torch::Tensor> bias_list;
  for (const c10::optional<torch::Tensor>& bias : biases) {
    bias_list.push_back(bias.has_value() ? *bias : torch::Tensor());
  }
  return rms_norm_linears(x, residual.has_value() ? *residual : torch::Tensor(), weight, eps, offset,
                          ToRMSNormCasting(casting), weights.vec(), bias_list);
}

}  // namespace

}  // namespace tigon::ops

// casting: 0 = Llama, 1 = Gemma, 2 = none (tigon::RMSNormCasting). Returns the projections, then h when
// residual is given.
TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def(
      "rms_norm_linears(Tensor x, Tensor? residual, Tensor weight, float eps, float offset, int casting, "
      "Tensor[] weights, Tensor?[] biases) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("rms_norm_linears", &tigon::ops::RMSNormLinearsOp);
}
