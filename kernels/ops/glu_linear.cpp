// glu_linear: the gated MLP's activation and down projection as one autograd node,
//   y = linear(act(a) * b, weight, bias),  act = silu (SwiGLU) or tanh-GELU (GeGLU).
// Saves a, b and the weight only; act(a) * b is recomputed in backward instead of being kept for the
// down projection's weight gradient. At Llama-3.2-1B shapes (8 x 2048 tokens, intermediate 8192, bf16)
// that is 256 MiB less per layer, 4 GiB over 16 layers. Forward values and gradients are the same as
// swiglu/geglu followed by a linear layer: the same products in the same order.
#include <torch/torch.h>

#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

torch::Tensor Activate(const torch::Tensor& a, const torch::Tensor& b, bool gelu) {
  return gelu ? geglu(a, b) : swiglu(a, b);
}

class GluLinearFunction : public torch::autograd::Function<GluLinearFunction> {
 public:
  // The bias (rare: Llama's mlp_bias) is added outside this node: LibTorch's custom functions ask every
  // tensor argument for its device, which an undefined tensor does not have.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& weight, bool gelu) {
    torch::Tensor h;
    {
      torch::NoGradGuard no_grad;
      h = Activate(a, b, gelu);
    }
    auto y = at::linear(h, weight);
    ctx->save_for_backward({a, b, weight});
    ctx->saved_data["gelu"] = gelu;
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const bool gelu = ctx->saved_data["gelu"].toBool();
    const auto& weight = saved[2];
    auto grad_y = grad_outputs[0];
    // Recompute the activation through the fused op, so its own backward gives d/da and d/db.
    auto a = saved[0].detach().requires_grad_(true);
    auto b = saved[1].detach().requires_grad_(true);
    torch::Tensor h;
    {
      torch::AutoGradMode enable(true);
      h = Activate(a, b, gelu);
    }
    const int64_t out_features = weight.size(0), in_features = weight.size(1);
    auto grad_y_rows = grad_y.reshape({-1, out_features});
    torch::Tensor grad_weight;
    if (ctx->needs_input_grad(2)) grad_weight = grad_y_rows.t().mm(h.detach().reshape({-1, in_features}));
    auto grad_h = grad_y.matmul(weight);
    auto grads = torch::autograd::grad({h}, {a, b}, {grad_h});
    return {grads[0], grads[1], grad_weight, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor glu_linear(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& weight,
                         const torch::Tensor& bias, bool gelu) {
  TORCH_CHECK(a.sizes() == b.sizes(), "glu_linear: a and b must have the same shape, got ", a.sizes(), " and ",
              b.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == a.size(-1), "glu_linear: weight must be [out, ",
              a.size(-1), "], got ", weight.sizes());
  auto y = GluLinearFunction::apply(a, b, weight, gelu);
  return bias.defined() ? y + bias : y;
}

}  // namespace tigon::ops
