// LayerNorm: the fused CPU path (tigon::ops) against torch.nn.functional.layer_norm (tigon::reference),
// forward and gradients, on fresh random inputs with odd shapes, strided layouts and without a bias.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "tests/kernels/expect_close.h"

namespace {

using tigon_test::ExpectClose;

const std::vector<std::vector<int64_t>> kShapes = {{7, 4095}, {1, 64}, {2, 5, 96}, {9, 2}};

std::string Describe(const std::vector<int64_t>& shape, bool bias) {
  return c10::str(c10::IntArrayRef(shape)) + (bias ? " with bias" : " without bias");
}

TEST(LayerNormCpu, ForwardMatchesReferenceFp32) {
  torch::manual_seed(201);
  for (const auto& shape : kShapes) {
    for (bool with_bias : {true, false}) {
      // An offset mean checks that the variance is taken from centred values.
      auto x = torch::randn(shape) * 3.0 + 5.0;
      auto w = torch::randn({shape.back()});
      auto b = with_bias ? torch::randn({shape.back()}) : torch::Tensor();
      auto fused = tigon::ops::layer_norm(x, w, b, 1e-5);
      auto ref = tigon::reference::layer_norm(x, w, b, 1e-5);
      // Same fp32 math up to the order of the row sums (~log2(H) * 6e-8 relative, times |mean|/std = 5/3).
      ExpectClose(fused, ref, 1e-5, 1e-5, Describe(shape, with_bias));
    }
  }
}

TEST(LayerNormCpu, ForwardBf16WithinOneRoundingOfFloat64) {
  torch::manual_seed(202);
  for (const auto& shape : kShapes) {
    auto x = torch::randn(shape).to(torch::kBFloat16);
    auto w = torch::randn({shape.back()}).to(torch::kBFloat16);
    auto b = torch::randn({shape.back()}).to(torch::kBFloat16);
    auto fused = tigon::ops::layer_norm(x, w, b, 1e-5);
    auto ref64 = tigon::reference::layer_norm(x.to(torch::kDouble), w.to(torch::kDouble), b.to(torch::kDouble), 1e-5);
    EXPECT_EQ(fused.scalar_type(), torch::kBFloat16);
    // fp32 inside, one bf16 rounding of the output (<= 2^-8 relative); atol for outputs near zero where
    // w * x_hat and b cancel.
    ExpectClose(fused, ref64, 1e-2, 1e-2, Describe(shape, true) + " bf16 vs float64");
  }
}

TEST(LayerNormCpu, GradientsMatchReferenceAutogradFloat64) {
  torch::manual_seed(203);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& shape : kShapes) {
    for (bool with_bias : {true, false}) {
      auto x = (torch::randn(shape, opts) + 2.0).requires_grad_(true);
      auto w = torch::randn({shape.back()}, opts).requires_grad_(true);
      auto b = with_bias ? torch::randn({shape.back()}, opts).requires_grad_(true) : torch::Tensor();
      auto dy = torch::randn(shape, opts);
      auto fused = tigon::ops::layer_norm(x, w, b, 1e-5);
      auto ref = tigon::reference::layer_norm(x, w, b, 1e-5);
      ExpectClose(fused, ref, 1e-12, 1e-10, Describe(shape, with_bias) + " forward");
      std::vector<torch::Tensor> inputs = {x, w};
      if (with_bias) inputs.push_back(b);
      auto g = torch::autograd::grad({fused}, inputs, {dy});
      auto g_ref = torch::autograd::grad({ref}, inputs, {dy});
      for (size_t i = 0; i < inputs.size(); ++i) {
        ExpectClose(g[i], g_ref[i], 1e-10, 1e-8, Describe(shape, with_bias) + " grad " + std::to_string(i));
      }
    }
  }
}

TEST(LayerNormCpu, NonContiguousInputs) {
  torch::manual_seed(204);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  std::vector<torch::Tensor> inputs = {torch::randn({100, 6}, opts).t(), torch::randn({6, 130}, opts).slice(1, 3, 103),
                                       torch::randn({3, 8, 100}, opts).transpose(0, 1)};
  for (auto x : inputs) {
    ASSERT_FALSE(x.is_contiguous());
    x.requires_grad_(true);
    auto w = torch::randn({x.size(-1)}, opts).requires_grad_(true);
    auto b = torch::randn({x.size(-1)}, opts).requires_grad_(true);
    auto dy = torch::randn(x.sizes(), opts).transpose(0, 1).contiguous().transpose(0, 1);
    auto fused = tigon::ops::layer_norm(x, w, b, 1e-5);
    auto ref = tigon::reference::layer_norm(x, w, b, 1e-5);
    ExpectClose(fused, ref, 1e-12, 1e-10, "strided forward");
    auto g = torch::autograd::grad({fused}, {x, w, b}, {dy});
    auto g_ref = torch::autograd::grad({ref}, {x, w, b}, {dy});
    for (int i = 0; i < 3; ++i) ExpectClose(g[i], g_ref[i], 1e-10, 1e-8, "strided grad " + std::to_string(i));
  }
}

TEST(LayerNormCpu, ParameterGradientsAreDeterministicAcrossThreadCounts) {
  torch::manual_seed(205);
  auto x = torch::randn({1000, 96}).requires_grad_(true);
  auto w = torch::randn({96}).requires_grad_(true);
  auto b = torch::randn({96}).requires_grad_(true);
  auto dy = torch::randn({1000, 96});
  const int threads = at::get_num_threads();
  std::vector<std::vector<torch::Tensor>> grads;
  for (int n : {1, 2, 4}) {
    at::set_num_threads(n);
    grads.push_back(torch::autograd::grad({tigon::ops::layer_norm(x, w, b, 1e-5)}, {w, b}, {dy}));
  }
  at::set_num_threads(threads);
  for (int i = 1; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(grads[0][0], grads[i][0]));
    EXPECT_TRUE(torch::equal(grads[0][1], grads[i][1]));
  }
}

TEST(LayerNormCpu, RegisteredTorchOpAcceptsMissingBias) {
  torch::manual_seed(206);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::layer_norm", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const c10::optional<torch::Tensor>&,
                                     double)>();
  auto x = torch::randn({4, 33}, torch::kDouble).requires_grad_(true);
  auto w = torch::randn({33}, torch::kDouble).requires_grad_(true);
  auto y = op.call(x, w, c10::nullopt, 1e-5);
  auto y_ref = tigon::reference::layer_norm(x, w, {}, 1e-5);
  ExpectClose(y, y_ref, 1e-12, 1e-10, "torch op forward");
  auto dy = torch::randn({4, 33}, torch::kDouble);
  auto g = torch::autograd::grad({y}, {x, w}, {dy});
  auto g_ref = torch::autograd::grad({y_ref}, {x, w}, {dy});
  ExpectClose(g[0], g_ref[0], 1e-10, 1e-8, "torch op dx");
  ExpectClose(g[1], g_ref[1], 1e-10, 1e-8, "torch op dweight");
}

TEST(LayerNormCpu, RejectsBadShapes) {
  auto x = torch::randn({2, 8});
  EXPECT_THROW(tigon::ops::layer_norm(x, torch::ones({7}), torch::zeros({7}), 1e-5), c10::Error);
  EXPECT_THROW(tigon::ops::layer_norm(x, torch::ones({8}), torch::zeros({9}), 1e-5), c10::Error);
}

}  // namespace
