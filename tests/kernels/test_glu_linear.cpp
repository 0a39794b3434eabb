// glu_linear (activation + down projection in one node, activation recomputed in backward) against the
// unfused composition reference::swiglu/geglu followed by a linear layer, in float64 and in bf16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace {

struct Grads {
  torch::Tensor y, da, db, dw, dbias;
};

Grads RunGlu(bool fused, bool gelu, const torch::Tensor& a0, const torch::Tensor& b0, const torch::Tensor& w0,
          const torch::Tensor& bias0, const torch::Tensor& dy) {
  auto a = a0.detach().clone().requires_grad_(true);
  auto b = b0.detach().clone().requires_grad_(true);
  auto w = w0.detach().clone().requires_grad_(true);
  torch::Tensor bias = bias0.defined() ? bias0.detach().clone().requires_grad_(true) : torch::Tensor();
  torch::Tensor y;
  if (fused) {
    y = tigon::ops::glu_linear(a, b, w, bias, gelu);
  } else {
    auto h = gelu ? tigon::reference::geglu(a, b) : tigon::reference::swiglu(a, b);
    y = bias.defined() ? at::linear(h, w, bias) : at::linear(h, w);
  }
  y.backward(dy);
  return {y.detach(), a.grad(), b.grad(), w.grad(), bias.defined() ? bias.grad() : torch::Tensor()};
}

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                 const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  EXPECT_TRUE(torch::allclose(actual.to(torch::kDouble), expected.to(torch::kDouble), rtol, atol))
      << what << ": max abs diff " << (actual.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>();
}

TEST(GluLinear, MatchesActivationThenLinearInFloat64) {
  torch::manual_seed(1);
  for (bool gelu : {false, true}) {
    for (bool with_bias : {false, true}) {
      // Odd sizes, 3-D input, and a, b as non-contiguous halves of one projection (Phi3's gate_up).
      auto gate_up = torch::randn({3, 7, 2 * 37}, torch::kDouble);
      auto a = gate_up.narrow(-1, 0, 37), b = gate_up.narrow(-1, 37, 37);
      auto w = torch::randn({19, 37}, torch::kDouble);
      auto bias = with_bias ? torch::randn({19}, torch::kDouble) : torch::Tensor();
      auto dy = torch::randn({3, 7, 19}, torch::kDouble);
      auto f = RunGlu(true, gelu, a, b, w, bias, dy);
      auto r = RunGlu(false, gelu, a, b, w, bias, dy);
      const std::string tag = std::string(gelu ? "geglu" : "swiglu") + (with_bias ? "+bias" : "");
      // float64 both ways: only summation order differs.
      ExpectClose(f.y, r.y, 1e-12, 1e-12, tag + " y");
      ExpectClose(f.da, r.da, 1e-12, 1e-12, tag + " da");
      ExpectClose(f.db, r.db, 1e-12, 1e-12, tag + " db");
      ExpectClose(f.dw, r.dw, 1e-12, 1e-12, tag + " dw");
      if (with_bias) ExpectClose(f.dbias, r.dbias, 1e-12, 1e-12, tag + " dbias");
    }
  }
}

TEST(GluLinear, Bf16MatchesTheUnfusedPath) {
  torch::manual_seed(2);
  auto a = torch::randn({64, 96}).to(torch::kBFloat16);
  auto b = torch::randn({64, 96}).to(torch::kBFloat16);
  auto w = (0.1 * torch::randn({48, 96})).to(torch::kBFloat16);
  auto dy = torch::randn({64, 48}).to(torch::kBFloat16);
  auto f = RunGlu(true, false, a, b, w, {}, dy);
  auto r = RunGlu(false, false, a, b, w, {}, dy);
  // The fused activation rounds act(a)*b to bf16 exactly like the reference, so outputs agree to bf16
  // rounding of the matmul (atol 1e-2 over values of order 1, rtol 1e-2 as in the paper).
  ExpectClose(f.y, r.y, 1e-2, 1e-2, "y");
  // dw sums 64 bf16 products per element; the two matmuls may round their partial sums in a different
  // order, so allow a couple of bf16 ulps of the largest entry (2^-8 relative each).
  ExpectClose(f.dw, r.dw, 1e-2, 2e-2 * r.dw.abs().max().item<double>(), "dw");
  ExpectClose(f.da, r.da, 1e-2, 1e-2, "da");
  ExpectClose(f.db, r.db, 1e-2, 1e-2, "db");
}

}  // namespace
