// squared_norm (CPU path) against sum(x^2) computed in float64 by the reference, on fresh random inputs of
// odd lengths, every dtype, non-contiguous views, and through the torch.ops.tigon registration.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace tigon {
namespace {

// Squares of bf16/fp16/fp32 values are exact in fp64, so only the order of the fp64 additions differs:
// a relative error of a few ulps of fp64 times log2(n).
constexpr double kRelTol = 1e-12;

TEST(SquaredNormCpu, MatchesFloat64ReferenceOnOddLengthsAndDtypes) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    for (int64_t n : {1, 7, 65535, 65537, 300001}) {
      torch::manual_seed(n + 11);
      const torch::Tensor x = (torch::randn({n}, torch::kDouble) * 3).to(dtype);
      const double got = ops::squared_norm(x).item<double>();
      const double want = reference::squared_norm(x).item<double>();
      EXPECT_NEAR(got, want, kRelTol * want) << dtype << " n=" << n;
      EXPECT_EQ(ops::squared_norm(x).scalar_type(), torch::kDouble);
    }
  }
}

TEST(SquaredNormCpu, EmptyIsZeroAndNonContiguousViewsAreRead) {
  EXPECT_EQ(ops::squared_norm(torch::empty({0}, torch::kBFloat16)).item<double>(), 0.0);
  torch::manual_seed(3);
  const torch::Tensor base = torch::randn({301, 77}, torch::kFloat);
  const torch::Tensor view = base.t().narrow(0, 3, 20);  // transposed and narrowed: strided
  ASSERT_FALSE(view.is_contiguous());
  const double want = reference::squared_norm(view.contiguous()).item<double>();
  EXPECT_NEAR(ops::squared_norm(view).item<double>(), want, kRelTol * want);
  // Not the whole base: the view's elements only.
  EXPECT_LT(ops::squared_norm(view).item<double>(), 0.5 * ops::squared_norm(base).item<double>());
}

TEST(SquaredNormCpu, DeterministicAndRegisteredAsTorchOp) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1 << 20}).to(torch::kBFloat16);
  EXPECT_EQ(ops::squared_norm(x).item<double>(), ops::squared_norm(x).item<double>());
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::squared_norm", "")
                .typed<torch::Tensor(const torch::Tensor&)>();
  EXPECT_EQ(op.call(x).item<double>(), ops::squared_norm(x).item<double>());
}

TEST(SquaredNormCpu, RejectsIntegerTensors) {
  EXPECT_THROW(ops::squared_norm(torch::ones({4}, torch::kInt32)), c10::Error);
}

}  // namespace
}  // namespace tigon
