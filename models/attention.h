// Causal self-attention core with grouped-query heads: softmax(q k^T * scale + mask) v.
#pragma once

#include <torch/types.h>

namespace tigon::models {

// q [B, Hq, T, D], k/v [B, Hk, T, D] (Hq a multiple of Hk) -> [B, Hq, T, D]. sliding_window > 0 limits
// each query to the last `sliding_window` keys (itself included), as Mistral's and Qwen2's masks do.
// Uses the fused scaled_dot_product_attention where LibTorch has it, else the eager Hugging Face
// composition (softmax in fp32, cast back to q's dtype).
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                              int64_t sliding_window = 0);

// Always the eager composition (the test oracle and the LibTorch 1.13 path).
torch::Tensor EagerCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                                   int64_t sliding_window = 0);

}  // namespace tigon::models
