// RMSNorm and add + RMSNorm: the fused CPU path (tigon::ops) against Hugging Face's composition
// (tigon::reference), forward and gradients, on fresh random inputs with odd shapes and strided layouts.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "tests/kernels/expect_close.h"

namespace {

using tigon::RMSNormCasting;

using tigon_test::ExpectClose;

struct Mode {
  RMSNormCasting casting;
  double offset;
  const char* name;
};
const Mode kModes[] = {{RMSNormCasting::kLlama, 0.0, "llama"},
                       {RMSNormCasting::kGemma, 1.0, "gemma(1 + w)"},
                       {RMSNormCasting::kNone, 0.0, "none"},
                       {RMSNormCasting::kLlama, 0.5, "llama offset 0.5"}};

// Odd hidden size, a single row, and 3-D input.
const std::vector<std::vector<int64_t>> kShapes = {{7, 4095}, {1, 64}, {2, 5, 96}, {33, 1}};

std::string Describe(const Mode& m, const std::vector<int64_t>& shape) {
  return std::string(m.name) + " " + c10::str(c10::IntArrayRef(shape));
}

TEST(RMSNormCpu, ForwardMatchesReferenceFp32) {
  torch::manual_seed(101);
  for (const auto& m : kModes) {
    for (const auto& shape : kShapes) {
      auto x = torch::randn(shape);
      auto w = torch::randn({shape.back()});
      auto fused = tigon::ops::rms_norm(x, w, 1e-6, m.offset, m.casting);
      auto ref = tigon::reference::rms_norm(x, w, 1e-6, m.offset, m.casting);
      EXPECT_EQ(fused.scalar_type(), ref.scalar_type());
      // Same fp32 math; only the order of the row sum differs (pairwise sums: ~log2(H) * 6e-8 relative).
      ExpectClose(fused, ref, 1e-6, 1e-5, Describe(m, shape));
    }
  }
}

TEST(RMSNormCpu, ForwardBf16WithinOneRoundingOfFloat64) {
  torch::manual_seed(102);
  for (const auto& m : kModes) {
    for (const auto& shape : kShapes) {
      auto x = torch::randn(shape).to(torch::kBFloat16);
      auto w = (1.0 + 0.1 * torch::randn({shape.back()})).to(torch::kBFloat16);
      auto fused = tigon::ops::rms_norm(x, w, 1e-6, m.offset, m.casting);
      auto ref_bf16 = tigon::reference::rms_norm(x, w, 1e-6, m.offset, m.casting);
      auto ref64 = tigon::reference::rms_norm(x.to(torch::kDouble), w.to(torch::kDouble), 1e-6, m.offset, m.casting);
      EXPECT_EQ(fused.scalar_type(), ref_bf16.scalar_type()) << Describe(m, shape);
      // bf16 keeps 8 significant bits: one rounding of the output is <= 2^-8 relative, Llama's extra
      // rounding of x_hat adds another 2^-8; rtol 1e-2 covers both, atol 1e-3 the values near zero.
      ExpectClose(fused, ref64, 1e-3, 1e-2, Describe(m, shape) + " vs float64");
      // Hugging Face's own bf16 composition rounds after every op (up to ~3 roundings for "none").
      ExpectClose(fused, ref_bf16, 1e-2, 2e-2, Describe(m, shape) + " vs bf16 reference");
    }
  }
}

TEST(RMSNormCpu, MixedDtypeFollowsHuggingFacePromotion) {
  torch::manual_seed(103);
  auto x = torch::randn({4, 40}).to(torch::kBFloat16);
  auto w = torch::randn({40});  // fp32 weight on bf16 activations
  for (const auto& m : kModes) {
    auto fused = tigon::ops::rms_norm(x, w, 1e-5, m.offset, m.casting);
    auto ref = tigon::reference::rms_norm(x, w, 1e-5, m.offset, m.casting);
    EXPECT_EQ(fused.scalar_type(), ref.scalar_type()) << m.name;  // Gemma: bf16, the others: fp32
    ExpectClose(fused, ref, 1e-2, 2e-2, std::string(m.name) + " bf16 x, fp32 w");
  }
}

// Gradients of x and weight against autograd through the reference composition, all in float64.
TEST(RMSNormCpu, GradientsMatchReferenceAutogradFloat64) {
  torch::manual_seed(104);
  for (const auto& m : kModes) {
    for (const auto& shape : kShapes) {
      auto opts = torch::TensorOptions().dtype(torch::kDouble);
      auto x = torch::randn(shape, opts).requires_grad_(true);
      auto w = torch::randn({shape.back()}, opts).requires_grad_(true);
      auto dy = torch::randn(shape, opts);
      auto fused = tigon::ops::rms_norm(x, w, 1e-6, m.offset, m.casting);
      auto ref = tigon::reference::rms_norm(x, w, 1e-6, m.offset, m.casting);
      ExpectClose(fused, ref, 1e-12, 1e-10, Describe(m, shape) + " forward");
      auto g_fused = torch::autograd::grad({fused}, {x, w}, {dy});
      auto g_ref = torch::autograd::grad({ref}, {x, w}, {dy});
      ExpectClose(g_fused[0], g_ref[0], 1e-10, 1e-8, Describe(m, shape) + " dx");
      ExpectClose(g_fused[1], g_ref[1], 1e-10, 1e-8, Describe(m, shape) + " dweight");
    }
  }
}

TEST(RMSNormCpu, NonContiguousInputs) {
  torch::manual_seed(105);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  // A transposed input (hidden not innermost in memory) and a column slice (rows farther apart than hidden).
  std::vector<torch::Tensor> inputs = {torch::randn({100, 6}, opts).t(), torch::randn({6, 130}, opts).slice(1, 3, 103),
                                       torch::randn({3, 8, 100}, opts).transpose(0, 1)};
  for (auto x : inputs) {
    ASSERT_FALSE(x.is_contiguous());
    x.requires_grad_(true);
    auto w = torch::randn({x.size(-1)}, opts).requires_grad_(true);
    auto dy = torch::randn(x.sizes(), opts).transpose(0, 1).contiguous().transpose(0, 1);  // strided dy too
    for (const auto& m : kModes) {
      auto fused = tigon::ops::rms_norm(x, w, 1e-6, m.offset, m.casting);
      auto ref = tigon::reference::rms_norm(x, w, 1e-6, m.offset, m.casting);
      ExpectClose(fused, ref, 1e-12, 1e-10, std::string(m.name) + " strided forward");
      auto g_fused = torch::autograd::grad({fused}, {x, w}, {dy});
      auto g_ref = torch::autograd::grad({ref}, {x, w}, {dy});
      ExpectClose(g_fused[0], g_ref[0], 1e-10, 1e-8, std::string(m.name) + " strided dx");
      ExpectClose(g_fused[1], g_ref[1], 1e-10, 1e-8, std::string(m.name) + " strided dweight");
    }
  }
}

TEST(RMSNormCpu, Bf16GradientsWithinTolerance) {
  torch::manual_seed(106);
  auto x64 = torch::randn({37, 257}, torch::kDouble);
  auto w64 = 1.0 + 0.1 * torch::randn({257}, torch::kDouble);
  auto dy64 = torch::randn({37, 257}, torch::kDouble);
  auto x = x64.to(torch::kBFloat16).requires_grad_(true);
  auto w = w64.to(torch::kBFloat16).requires_grad_(true);
  auto dy = dy64.to(torch::kBFloat16);
  auto xr = x.detach().to(torch::kDouble).requires_grad_(true);
  auto wr = w.detach().to(torch::kDouble).requires_grad_(true);
  auto g_fused = torch::autograd::grad({tigon::ops::rms_norm(x, w, 1e-6, 0.0, RMSNormCasting::kLlama)}, {x, w}, {dy});
  auto g_ref = torch::autograd::grad({tigon::reference::rms_norm(xr, wr, 1e-6, 0.0, RMSNormCasting::kLlama)}, {xr, wr},
                                     {dy.to(torch::kDouble)});
  // dx: fp32 math, one bf16 rounding (2^-8) plus Llama's rounded x_hat in the forward; dweight sums 37
  // products of bf16-rounded x_hat, so its error is relative to the sum of |terms|, hence the atol.
  ExpectClose(g_fused[0], g_ref[0], 1e-2, 2e-2, "bf16 dx");
  ExpectClose(g_fused[1], g_ref[1], 5e-2, 2e-2, "bf16 dweight");
}

// dweight is summed per fixed block of rows, then over blocks: the bits cannot depend on the thread count.
TEST(RMSNormCpu, WeightGradientIsDeterministicAcrossThreadCounts) {
  torch::manual_seed(107);
  auto x = torch::randn({1000, 96}).requires_grad_(true);
  auto w = torch::randn({96}).requires_grad_(true);
  auto dy = torch::randn({1000, 96});
  const int threads = at::get_num_threads();
  std::vector<torch::Tensor> dweights;
  for (int n : {1, 2, 4}) {
    at::set_num_threads(n);
    auto y = tigon::ops::rms_norm(x, w, 1e-6, 0.0, RMSNormCasting::kLlama);
    dweights.push_back(torch::autograd::grad({y}, {w}, {dy})[0]);
  }
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(dweights[0], dweights[1]));
  EXPECT_TRUE(torch::equal(dweights[0], dweights[2]));
}

TEST(AddRMSNormCpu, ForwardAndGradientsMatchReference) {
  torch::manual_seed(108);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& m : kModes) {
    for (const auto& shape : kShapes) {
      auto x = torch::randn(shape, opts).requires_grad_(true);
      auto residual = torch::randn(shape, opts).requires_grad_(true);
      auto w = torch::randn({shape.back()}, opts).requires_grad_(true);
      auto [y, residual_out] = tigon::ops::add_rms_norm(x, residual, w, 1e-6, m.offset, m.casting);
      auto [y_ref, residual_out_ref] = tigon::reference::add_rms_norm(x, residual, w, 1e-6, m.offset, m.casting);
      ExpectClose(y, y_ref, 1e-12, 1e-10, Describe(m, shape) + " y");
      ExpectClose(residual_out, residual_out_ref, 0.0, 0.0, Describe(m, shape) + " residual_out");
      // Both outputs feed the loss, as in a decoder (the residual stream continues past the norm).
      auto dy = torch::randn(shape, opts), dres = torch::randn(shape, opts);
      auto g = torch::autograd::grad({y, residual_out}, {x, residual, w}, {dy, dres});
      auto g_ref = torch::autograd::grad({y_ref, residual_out_ref}, {x, residual, w}, {dy, dres});
      for (int i = 0; i < 3; ++i)
        ExpectClose(g[i], g_ref[i], 1e-10, 1e-8, Describe(m, shape) + " grad " + std::to_string(i));
    }
  }
}

TEST(AddRMSNormCpu, Bf16ResidualIsRoundedLikeHuggingFace) {
  torch::manual_seed(109);
  auto x = torch::randn({5, 300}).to(torch::kBFloat16);
  auto residual = torch::randn({5, 300}).to(torch::kBFloat16);
  auto w = torch::randn({300}).to(torch::kBFloat16);
  auto [y, residual_out] = tigon::ops::add_rms_norm(x, residual, w, 1e-6, 0.0, RMSNormCasting::kLlama);
  auto [y_ref, residual_out_ref] = tigon::reference::add_rms_norm(x, residual, w, 1e-6, 0.0, RMSNormCasting::kLlama);
  EXPECT_TRUE(torch::equal(residual_out, residual_out_ref));  // one bf16 add, bit for bit
  ExpectClose(y, y_ref, 1e-2, 1e-2, "bf16 add_rms_norm y");
}

TEST(RMSNormCpu, RegisteredTorchOpRunsWithAutograd) {
  torch::manual_seed(110);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::rms_norm", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, double, double, int64_t)>();
  auto x = torch::randn({3, 50}, torch::kDouble).requires_grad_(true);
  auto w = torch::randn({50}, torch::kDouble).requires_grad_(true);
  auto y = op.call(x, w, 1e-6, 1.0, static_cast<int64_t>(RMSNormCasting::kGemma));
  auto y_ref = tigon::reference::rms_norm(x, w, 1e-6, 1.0, RMSNormCasting::kGemma);
  ExpectClose(y, y_ref, 1e-12, 1e-10, "torch op forward");
  auto dy = torch::randn({3, 50}, torch::kDouble);
  auto g = torch::autograd::grad({y}, {x, w}, {dy});
  auto g_ref = torch::autograd::grad({y_ref}, {x, w}, {dy});
  ExpectClose(g[0], g_ref[0], 1e-10, 1e-8, "torch op dx");
  ExpectClose(g[1], g_ref[1], 1e-10, 1e-8, "torch op dweight");
}

TEST(RMSNormCpu, RejectsBadShapesAndModes) {
  auto x = torch::randn({2, 8});
  EXPECT_THROW(tigon::ops::rms_norm(x, torch::ones({7}), 1e-6, 0.0, RMSNormCasting::kLlama), c10::Error);
  EXPECT_THROW(tigon::ops::add_rms_norm(x, torch::randn({2, 7}), torch::ones({8}), 1e-6, 0.0, RMSNormCasting::kLlama),
               c10::Error);
  EXPECT_THROW(tigon::ops::rms_norm(x, torch::ones({8}), 1e-6, 0.0, static_cast<RMSNormCasting>(7)), c10::Error);
}

}  // namespace
