// LayerNorm over the last dim as an autograd function (LayerNormFunction). CUDA tensors go to
// kernels/cuda/layer_norm.cu; CPU tensors run the same fused math here, over blocks of rows with ATen ops in
// fp32 (float64 for float64 inputs).
// Saved: x, weight, and per-row mean and rstd. Backward recomputes x_hat = (x - mean) * rstd; dweight and
// dbias are reduced in two stages (per-block partial sums, then a sum over blocks): deterministic.
// Output dtype = x's (as torch.nn.functional.layer_norm with a float32 weight on bf16 input).
#include "kernels/cuda/layer_norm.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Optional.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "kernels/ops/cuda_glue.h"
#include "kernels/ops/op_helpers.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per CPU task; also the rows summed into one partial of dweight/dbias (fixed, hence deterministic).
constexpr int64_t kCpuRowBlock = 64;

void CheckInputs(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1, "tigon::layer_norm: x needs at least one dim");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "tigon::layer_norm: weight must be [", x.size(-1),
              "], got ", weight.sizes());
  TORCH_CHECK(!bias.defined() || bias.sizes() == weight.sizes(), "tigon::layer_norm: bias must be [", x.size(-1),
              "], got ", bias.sizes());
  TORCH_CHECK(weight.device() == x.device() && (!bias.defined() || bias.device() == x.device()),
              "tigon::layer_norm: x, weight and bias must be on one device");
}

// ---- CPU fused path -------------------------------------------------------------------------------------

struct Statistics {
  torch::Tensor y, mean, rstd;
};

Statistics LayerNormForwardCpu(const torch::Tensor& x2d, const torch::Tensor& weight, const torch::Tensor& bias,
                               double eps) {
  const auto acc = AccumulateType(x2d.scalar_type());
  const int64_t rows = x2d.size(0), hidden = x2d.size(1);
  Statistics out{torch::empty({rows, hidden}, x2d.options()), torch::empty({rows}, x2d.options().dtype(acc)),
                 torch::empty({rows}, x2d.options().dtype(acc))};
  const auto w = weight.to(acc);
  const auto b = bias.defined() ? bias.to(acc) : torch::Tensor();
  at::parallel_for(0, rows, kCpuRowBlock, [&](int64_t begin, int64_t end) {
    auto xb = x2d.slice(0, begin, end).to(acc);
    auto mean = xb.mean(-1, /*keepdim=*/true);
    auto centered = xb - mean;
    auto rstd = torch::rsqrt(centered.pow(2).mean(-1, /*keepdim=*/true) + eps);
    auto y = centered * rstd * w;
    if (b.defined()) y = y + b;
    out.y.slice(0, begin, end).copy_(y);
    out.mean.slice(0, begin, end).copy_(mean.squeeze(-1));
    out.rstd.slice(0, begin, end).copy_(rstd.squeeze(-1));
  });
  return out;
}

// (dx, dweight, dbias); dbias undefined when the op had no bias.
tensor_list LayerNormBackwardCpu(const torch::Tensor& dy2d, const torch::Tensor& x2d, const torch::Tensor& weight,
                                 bool has_bias, const torch::Tensor& mean, const torch::Tensor& rstd) {
  const auto acc = AccumulateType(x2d.scalar_type());
  const int64_t rows = x2d.size(0), hidden = x2d.size(1);
  const int64_t num_blocks = (rows + kCpuRowBlock - 1) / kCpuRowBlock;
  auto dx = torch::empty({rows, hidden}, x2d.options());
  auto dweight_partials = torch::zeros({std::max<int64_t>(num_blocks, 1), hidden}, x2d.options().dtype(acc));
  auto dbias_partials = torch::zeros_like(dweight_partials);
  const auto w = weight.to(acc);
  at::parallel_for(0, num_blocks, 1, [&](int64_t first_block, int64_t last_block) {
    for (int64_t block = first_block; block < last_block; ++block) {
      const int64_t begin = block * kCpuRowBlock, end = std::min(rows, begin + kCpuRowBlock);
      auto dyb = dy2d.slice(0, begin, end).to(acc);
      auto r = rstd.slice(0, begin, end).to(acc).unsqueeze(-1);
      auto x_hat = (x2d.slice(0, begin, end).to(acc) - mean.slice(0, begin, end).to(acc).unsqueeze(-1)) * r;
      auto g = dyb * w;
      dx.slice(0, begin, end)
          .copy_(r * (g - x_hat * (g * x_hat).mean(-1, /*keepdim=*/true) - g.mean(-1, /*keepdim=*/true)));
      dweight_partials[block].copy_((dyb * x_hat).sum(0));
      if (has_bias) dbias_partials[block].copy_(dyb.sum(0));
    }
  });
  auto dweight = dweight_partials.sum(0).to(weight.scalar_type());
  auto dbias = has_bias ? dbias_partials.sum(0).to(weight.scalar_type()) : torch::Tensor();
  return {dx, dweight, dbias};
}

// ---- CUDA path ------------------------------------------------------------------------------------------

#ifdef TIGON_CUDA_KERNELS
Statistics LayerNormForwardCuda(const torch::Tensor& x2d, const torch::Tensor& weight, const torch::Tensor& bias,
                                double eps) {
  TORCH_CHECK(weight.scalar_type() == x2d.scalar_type() || weight.scalar_type() == torch::kFloat,
              "tigon::layer_norm (CUDA): weight must have x's dtype or float32, got ", weight.scalar_type());
  TORCH_CHECK(!bias.defined() || bias.scalar_type() == weight.scalar_type(),
              "tigon::layer_norm (CUDA): bias and weight dtypes differ");
  const int64_t rows = x2d.size(0), hidden = x2d.size(1);
  Statistics out{torch::empty({rows, hidden}, x2d.options()), torch::empty({rows}, x2d.options().dtype(torch::kFloat)),
                 torch::empty({rows}, x2d.options().dtype(torch::kFloat))};
  if (rows == 0 || hidden == 0) return out;
  const auto w = weight.contiguous();
  const auto b = bias.defined() ? bias.contiguous() : torch::Tensor();
  cuda::LayerNormForwardParams p;
  p.x = x2d.data_ptr();
  p.x_row_stride = x2d.stride(0);
  p.weight = w.data_ptr();
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.y = out.y.data_ptr();
  p.y_row_stride = out.y.stride(0);
  p.mean = out.mean.data_ptr<float>();
  p.rstd = out.rstd.data_ptr<float>();
  p.rows = rows;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  p.x_dtype = CudaDType(x2d);
  p.weight_dtype = CudaDType(w);
  CheckLaunch(cuda::layer_norm_forward(p, CurrentCudaStream(x2d.device())), "layer_norm_forward");
  return out;
}

tensor_list LayerNormBackwardCuda(const torch::Tensor& dy2d, const torch::Tensor& x2d, const torch::Tensor& weight,
                                  bool has_bias, const torch::Tensor& mean, const torch::Tensor& rstd) {
  const int64_t rows = x2d.size(0), hidden = x2d.size(1);
  auto dx = torch::empty({rows, hidden}, x2d.options());
  const auto w = weight.contiguous();
  if (rows == 0 || hidden == 0) {
    return {dx, torch::zeros_like(w), has_bias ? torch::zeros_like(w) : torch::Tensor()};
  }
  auto dy = dy2d.scalar_type() == x2d.scalar_type() ? dy2d : AsRows(dy2d.to(x2d.scalar_type()), hidden);
  auto dweight = torch::empty({hidden}, w.options());
  auto dbias = has_bias ? torch::empty({hidden}, w.options()) : torch::Tensor();
  const int64_t num_partials = cuda::layer_norm_backward_num_partials(rows);
  auto dweight_partials = torch::empty({num_partials, hidden}, x2d.options().dtype(torch::kFloat));
  auto dbias_partials = has_bias ? torch::empty_like(dweight_partials) : torch::Tensor();
  cuda::LayerNormBackwardParams p;
  p.dy = dy.data_ptr();
  p.dy_row_stride = dy.stride(0);
  p.x = x2d.data_ptr();
  p.x_row_stride = x2d.stride(0);
  p.weight = w.data_ptr();
  p.mean = mean.data_ptr<float>();
  p.rstd = rstd.data_ptr<float>();
  p.dx = dx.data_ptr();
  p.dx_row_stride = dx.stride(0);
  p.dweight = dweight.data_ptr();
  p.dbias = has_bias ? dbias.data_ptr() : nullptr;
  p.dweight_partials = dweight_partials.data_ptr<float>();
  p.dbias_partials = has_bias ? dbias_partials.data_ptr<float>() : nullptr;
  p.rows = rows;
  p.hidden = hidden;
  p.x_dtype = CudaDType(x2d);
  p.weight_dtype = CudaDType(w);
  CheckLaunch(cuda::layer_norm_backward(p, CurrentCudaStream(x2d.device())), "layer_norm_backward");
  return {dx, dweight, dbias};
}
#endif  // TIGON_CUDA_KERNELS

// ---- autograd function ----------------------------------------------------------------------------------

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  // bias travels as an optional: LibTorch 1.13's Function::apply rejects undefined tensor arguments.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& maybe_bias, double eps) {
    const torch::Tensor bias = maybe_bias.has_value() ? *maybe_bias : torch::Tensor();
    CheckInputs(x, weight, bias);
    c10::OptionalDeviceGuard guard(x.device());
    auto x2d = AsRows(x, x.size(-1));
    Statistics out;
#ifdef TIGON_CUDA_KERNELS
    if (x.is_cuda()) out = LayerNormForwardCuda(x2d, weight, bias, eps);
#endif
    if (!out.y.defined()) out = LayerNormForwardCpu(x2d, weight, bias, eps);
    ctx->save_for_backward({x2d, weight, out.mean, out.rstd});
    ctx->saved_data["has_bias"] = bias.defined();
    return out.y.view(x.sizes());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2d = saved[0];
    const auto& weight = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    c10::OptionalDeviceGuard guard(x2d.device());
    const auto input_sizes = grad_outputs[0].sizes().vec();
    auto dy2d = AsRows(grad_outputs[0], x2d.size(1));
    tensor_list grads;
#ifdef TIGON_CUDA_KERNELS
    if (x2d.is_cuda()) grads = LayerNormBackwardCuda(dy2d, x2d, weight, has_bias, saved[2], saved[3]);
#endif
    if (grads.empty()) grads = LayerNormBackwardCpu(dy2d, x2d, weight, has_bias, saved[2], saved[3]);
    return {grads[0].view(input_sizes), grads[1], grads[2], torch::Tensor()};
  }
};

torch::Tensor LayerNormOp(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias,
                          double eps) {
  const bool has_bias = bias.has_value() && bias->defined();
  return LayerNormFunction::apply(x, weight, has_bias ? bias : c10::optional<torch::Tensor>(), eps);
}

}  // namespace

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
  return LayerNormOp(x, weight, bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt, eps);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def("layer_norm(Tensor x, Tensor weight, Tensor? bias, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("layer_norm", &tigon::ops::LayerNormOp);
}
