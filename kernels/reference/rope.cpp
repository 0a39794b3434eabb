// Hugging Face's apply_rotary_pos_emb (unsqueeze_dim=1): q * cos + rotate_half(q) * sin.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {
namespace {

// [x1, x2] -> [-x2, x1] over the last dim.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.slice(-1, 0, half);
  auto x2 = x.slice(-1, half);
  return torch::cat({-x2, x1}, -1);
}

// cos/sin [T, D] broadcast as they are; [B, T, D] get the head dim inserted: [B, 1, T, D].
torch::Tensor broadcast_over_heads(const torch::Tensor& t) {
  TORCH_CHECK(t.dim() == 2 || t.dim() == 3, "tigon::reference::rope: cos/sin must be [T, D] or [B, T, D]");
  return t.dim() == 3 ? t.unsqueeze(1) : t;
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                              const torch::Tensor& sin) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "tigon::reference::rope: q and k must be [B, H, T, D]");
  TORCH_CHECK(q.size(-1) % 2 == 0, "tigon::reference::rope: head dim must be even");
  auto c = broadcast_over_heads(cos);
  auto s = broadcast_over_heads(sin);
  auto q_embed = q * c + rotate_half(q) * s;
  auto k_embed = k * c + rotate_half(k) * s;
  return {q_embed, k_embed};
}

}  // namespace tigon::reference
