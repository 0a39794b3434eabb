#include "models/attention.h"

#include <limits>

#include "kernels/torch_compat.h"

namespace tigon::models {
namespace {

// Hugging Face's repeat_kv: [B, Hk, T, D] -> [B, Hk * groups, T, D], each kv head repeated `groups` times.
torch::Tensor RepeatKv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, groups, t, d}).reshape({b, h * groups, t, d});
}

}  // namespace

torch::Tensor EagerCausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                                   int64_t sliding_window) {
  const int64_t groups = q.size(1) / k.size(1);
  const torch::Tensor keys = RepeatKv(k, groups);
  const torch::Tensor values = RepeatKv(v, groups);
  const int64_t t = q.size(2);
  const int64_t s = keys.size(2);
  torch::Tensor scores = torch::matmul(q, keys.transpose(2, 3)) * scale;
  // Query i (at absolute position s - t + i) sees keys j <= its position, within the window.
  const auto index_options = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
  const torch::Tensor query_pos = torch::arange(s - t, s, index_options).unsqueeze(1);
  const torch::Tensor key_pos = torch::arange(s, index_options).unsqueeze(0);
  torch::Tensor masked = key_pos > query_pos;
  if (sliding_window > 0) masked = masked.logical_or(query_pos - key_pos >= sliding_window);
  scores = scores.masked_fill(masked, -std::numeric_limits<double>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  return torch::matmul(probs, values);
}

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                              int64_t sliding_window) {
  if (compat::kHasScaledDotProductAttention && (sliding_window <= 0 || sliding_window >= k.size(2))) {
    return compat::causal_scaled_dot_product_attention(q, k, v, scale);
  }
  return EagerCausalAttention(q, k, v, scale, sliding_window);
}

}  // namespace tigon::models
