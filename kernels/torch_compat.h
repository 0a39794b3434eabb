// The one place that absorbs LibTorch version differences: Debian's 1.13 (CPU, CI) and 2.11 (CUDA, the GPU
// machine). Code elsewhere calls these wrappers instead of testing TORCH_VERSION_* itself.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>
#include <torch/version.h>

#include <cstdint>

#define TIGON_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace tigon::compat {

// at::scaled_dot_product_attention: public from 2.0, its `scale` argument from 2.1, `enable_gqa` from 2.5.
inline constexpr bool kHasScaledDotProductAttention = TIGON_TORCH_AT_LEAST(2, 1);

// Causal softmax(q k^T * scale) v through the fused SDPA kernels. q [B, Hq, T, D], k/v [B, Hk, T, D] with
// Hq a multiple of Hk. Only call when kHasScaledDotProductAttention; otherwise it throws.
inline torch::Tensor causal_scaled_dot_product_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& v, double scale) {
#if TIGON_TORCH_AT_LEAST(2, 5)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
                                          /*enable_gqa=*/q.size(1) != k.size(1));
#elif TIGON_TORCH_AT_LEAST(2, 1)
  const int64_t groups = q.size(1) / k.size(1);
  auto expand = [groups](const torch::Tensor& t) { return groups == 1 ? t : t.repeat_interleave(groups, /*dim=*/1); };
  return at::scaled_dot_product_attention(q, expand(k), expand(v), /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, scale);
#else
  (void)q, (void)k, (void)v, (void)scale;
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch >= 2.1 (this is ", TORCH_VERSION, ")");
  return {};
#endif
}

// A CPU generator seeded with `seed` (same stream on every LibTorch version we build against).
inline at::Generator cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace tigon::compat
