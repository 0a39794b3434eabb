// torch.optim.AdamW's single-tensor update (torch 2.x, non-foreach), written with the same ATen ops in
// the same order: decoupled decay, lerp for the first moment, addcmul for the second,
// denom = sqrt(v) / sqrt(1 - b2^t) + eps, step = lr / (1 - b1^t). The math runs in fp32 (fp64 for fp64
// buffers) like torch's fused AdamW does for bf16/fp16 buffers, and the results are cast back.
#include <torch/torch.h>

#include <cmath>

#include "kernels/reference/reference.h"

namespace tigon::reference {

void adamw_step(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                const AdamWOptions& options, torch::Tensor param_copy) {
  TORCH_CHECK(grad.numel() == param.numel() && exp_avg.numel() == param.numel() && exp_avg_sq.numel() == param.numel(),
              "adamw_step: param, grad, exp_avg and exp_avg_sq must have the same length");
  TORCH_CHECK(options.step >= 1, "adamw_step: step is 1-based");
  torch::NoGradGuard no_grad;
  const auto math = param.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  torch::Tensor p = param.to(math, /*non_blocking=*/false, /*copy=*/true);
  torch::Tensor g = grad.to(math).reshape(param.sizes());
  if (options.grad_scale != 1.0) g = g * options.grad_scale;
  torch::Tensor m = exp_avg.to(math, false, true).reshape(param.sizes());
  torch::Tensor v = exp_avg_sq.to(math, false, true).reshape(param.sizes());

  if (options.weight_decay != 0) p.mul_(1 - options.lr * options.weight_decay);
  m.lerp_(g, 1 - options.beta1);
  v.mul_(options.beta2).addcmul_(g, g, 1 - options.beta2);
  const double step = static_cast<double>(options.step);
  const double bias_correction1 = 1 - std::pow(options.beta1, step);
  const double bias_correction2 = 1 - std::pow(options.beta2, step);
  const double step_size = options.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  const torch::Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(options.eps);
  p.addcdiv_(m, denom, -step_size);

  param.copy_(p);
  exp_avg.copy_(m.reshape(exp_avg.sizes()));
  exp_avg_sq.copy_(v.reshape(exp_avg_sq.sizes()));
  if (param_copy.defined()) {
    TORCH_CHECK(param_copy.numel() == param.numel(), "adamw_step: param_copy must have param's length");
    param_copy.copy_(p.reshape(param_copy.sizes()));
  }
}

}  // namespace tigon::reference
