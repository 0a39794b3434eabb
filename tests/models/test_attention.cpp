// The attention core against a per-query loop in float64: grouped-query heads, the causal mask, Mistral's
// sliding window; and the dispatching CausalAttention (fused SDPA on LibTorch >= 2.1) against the eager
// composition, values and gradients.
#include "models/attention.h"

#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

// out[b, h, i] = sum_j softmax_j(q[b,h,i] . k[b,h/groups,j] * scale) v[b,h/groups,j] over
// max(0, i - window + 1) <= j <= i, one query at a time.
torch::Tensor LoopAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale,
                            int64_t window) {
  const auto q64 = q.to(torch::kFloat64), k64 = k.to(torch::kFloat64), v64 = v.to(torch::kFloat64);
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), groups = q.size(1) / k.size(1);
  torch::Tensor out = torch::zeros(q.sizes(), torch::kFloat64);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        const torch::Tensor keys = k64[b][h / groups].narrow(0, first, i - first + 1);
        const torch::Tensor values = v64[b][h / groups].narrow(0, first, i - first + 1);
        const torch::Tensor probs = torch::softmax(keys.matmul(q64[b][h][i]) * scale, 0);
        out[b][h][i] = probs.matmul(values);
      }
    }
  }
  return out;
}

TEST(Attention, EagerMatchesPerQueryLoopWithGqaAndWindows) {
  torch::manual_seed(11);
  // Odd sizes: 6 query heads over 2 kv heads, 9 positions, head dim 5.
  const auto q = torch::randn({2, 6, 9, 5}), k = torch::randn({2, 2, 9, 5}), v = torch::randn({2, 2, 9, 5});
  for (const int64_t window : {0, 1, 3, 9, 20}) {
    const double scale = 1.0 / std::sqrt(5.0);
    const auto expected = LoopAttention(q, k, v, scale, window);
    EXPECT_LT(testing::RelativeError(EagerCausalAttention(q, k, v, scale, window), expected), 1e-6) << window;
    EXPECT_LT(testing::RelativeError(CausalAttention(q, k, v, scale, window), expected), 1e-5) << window;
  }
  // Window 1 attends only to itself: the output is the (repeated) value row.
  const auto self_only = EagerCausalAttention(q, k, v, 0.5, 1);
  EXPECT_TRUE(torch::allclose(self_only, v.repeat_interleave(3, 1), 1e-6, 1e-6));
}

TEST(Attention, DispatchedAttentionGradientsMatchEager) {
  torch::manual_seed(12);
  // Non-contiguous inputs, as the decoder passes them ([B, T, H, D] transposed).
  auto make = [](int64_t heads) { return torch::randn({2, 7, heads, 8}).transpose(1, 2).requires_grad_(true); };
  const auto q = make(4), k = make(2), v = make(2);
  const auto grad_out = torch::randn({2, 4, 7, 8});
  auto grads = [&](bool eager) {
    const auto out = eager ? EagerCausalAttention(q, k, v, 0.3) : CausalAttention(q, k, v, 0.3);
    return torch::autograd::grad({out}, {q, k, v}, {grad_out});
  };
  const auto eager = grads(true), dispatched = grads(false);
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(testing::RelativeError(dispatched[i], eager[i]), 1e-5) << i;
}

}  // namespace
}  // namespace tigon::models
