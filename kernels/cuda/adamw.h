// One AdamW step over flat buffers, in place (launcher; no CUDA or torch headers here).
//
// torch.optim.AdamW's update with every intermediate in fp32, whatever the storage dtypes:
//   g = grad * grad_scale
//   p = p * (1 - lr * weight_decay)
//   m = lerp(m, g, 1 - beta1)
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// then p, m, v are stored back in their dtypes and, when param_copy is set, p is also stored there in
// param_copy's dtype (the bf16 model weights of fp32 master weights). Nothing is saved; one read and one
// write of each buffer (grad read only). Optionally the same pass sums the gradient's squares (below).
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

struct AdamWParams {
  void* param = nullptr;
  DType param_dtype = DType::kFloat32;
  const void* grad = nullptr;
  DType grad_dtype = DType::kFloat32;  // any: bf16 gradients of fp32 master weights are the bf16_mixed case
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  DType state_dtype = DType::kFloat32;  // kFloat32 or param_dtype, both moments alike
  void* param_copy = nullptr;           // optional
  DType param_copy_dtype = DType::kBFloat16;
  int64_t n = 0;  // elements in each buffer, all contiguous
  // Scalars, computed by the caller in double and rounded once to fp32.
  float decay_factor = 1.f;  // 1 - lr * weight_decay
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float step_size = 1e-4f;            // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.f;  // sqrt(1 - beta2^t)
  float eps = 1e-8f;
  float grad_scale = 1.f;
  // Optional, kAdamWGradSquarePartials doubles: receives sum(grad^2) of the raw (unscaled) gradient split
  // into per-block partials in fp64, every entry written (zeros past the last block), so the sum of the
  // entries in any fixed order is the gradient's squared norm. With the optimizer in backward this
  // replaces a second read of every gradient.
  double* grad_square_partials = nullptr;
};

// Entries of AdamWParams::grad_square_partials: at least the blocks the kernel is launched with.
constexpr int64_t kAdamWGradSquarePartials = 2048;

LaunchStatus adamw_step(const AdamWParams& params, void* stream);

}  // namespace tigon::cuda
