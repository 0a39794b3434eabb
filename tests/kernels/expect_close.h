// The tolerance check the kernel tests share: |actual - expected| <= atol + rtol |expected| everywhere,
// compared in float64; a failure prints the worst element.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace tigon_test {

inline void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, double atol, double rtol,
                        const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  auto a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  auto excess = (a - e).abs() - (atol + rtol * e.abs());
  const double worst = excess.max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": max |diff| " << (a - e).abs().max().item<double>() << " beyond tolerance by "
                        << worst;
}

}  // namespace tigon_test
