// glu_linear (activation + down projection in one node, activation recomputed in backward) against:
//   * the backward it had before it wrote grad_a in place (recompute h, weight gradient, grad_h = grad_y @ W,
//     the activation's fused backward into fresh grad_a and grad_b), written out below: bit for bit, in
//     fp32, float64, bf16 and fp16, on odd shapes and non-contiguous inputs;
//   * the unfused composition reference::swiglu/geglu followed by a linear layer, in float64 (and in bf16),
//     and a float64 evaluation of it on the rounded inputs of the lower precisions.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops/glu_linear.h"
#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace {

struct Grads {
  torch::Tensor y, da, db, dw, dbias;
};

Grads RunGlu(bool fused, bool gelu, const torch::Tensor& a0, const torch::Tensor& b0, const torch::Tensor& w0,
             const torch::Tensor& bias0, const torch::Tensor& dy) {
  // New leaves over the same memory: the inputs keep their layout (a clone of a strided half would not).
  auto a = a0.detach().requires_grad_(true);
  auto b = b0.detach().requires_grad_(true);
  auto w = w0.detach().requires_grad_(true);
  torch::Tensor bias = bias0.defined() ? bias0.detach().requires_grad_(true) : torch::Tensor();
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

// ---- against the backward as it was before grad_a went in place -------------------------------------------

// The fused CPU backward formulas of swiglu.cpp / geglu.cpp as they were when they returned fresh da and db
// (fp32 math, float64 for float64, one rounding). Copied here so the comparison does not depend on the code
// under test.
std::pair<torch::Tensor, torch::Tensor> PreviousActivationBackward(bool gelu, const torch::Tensor& dy,
                                                                   const torch::Tensor& a, const torch::Tensor& b) {
  const auto acc = a.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto af = a.to(acc), bf = b.to(acc), dyf = dy.to(acc);
  if (!gelu) {
    auto s = torch::sigmoid(af);
    auto da = dyf * bf * s * (1.0 + af * (1.0 - s));
    auto db = dyf * af * s;
    return {da.to(a.scalar_type()), db.to(b.scalar_type())};
  }
  constexpr double kSqrt2OverPi = 0.7978845608028654, kCubic = 0.044715;
  auto s = torch::sigmoid(2.0 * kSqrt2OverPi * (af + kCubic * af * af * af));
  auto gelu_grad = s + 2.0 * af * s * (1.0 - s) * kSqrt2OverPi * (1.0 + 3.0 * kCubic * af * af);
  auto da = dyf * bf * gelu_grad;
  auto db = dyf * af * s;
  return {da.to(a.scalar_type()), db.to(b.scalar_type())};
}

// glu_linear's previous composition: h = act(a) * b (the fused forward), y = linear(h, w); in backward h is
// recomputed, dw = grad_y^T h, grad_h = grad_y @ w, (da, db) from the activation's backward.
Grads PreviousGluLinear(bool gelu, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& w,
                        const torch::Tensor& dy) {
  torch::NoGradGuard no_grad;
  auto h = gelu ? tigon::ops::geglu(a, b) : tigon::ops::swiglu(a, b);
  Grads g;
  g.y = at::linear(h, w);
  g.dw = dy.reshape({-1, w.size(0)}).t().mm(h.reshape({-1, w.size(1)}));
  auto grad_h = dy.matmul(w);
  std::tie(g.da, g.db) = PreviousActivationBackward(gelu, grad_h, a, b);
  return g;
}

struct GluInputs {
  std::string name;
  torch::Tensor a, b, w, dy;
};

// Odd shapes and the layouts the model produces: plain, 3-D, 1-D, no rows, the strided halves of one
// gate_up projection with a transposed incoming gradient, and transposed a and b.
std::vector<GluInputs> Inputs(torch::ScalarType dtype) {
  auto r = [&](std::vector<int64_t> shape, double scale = 1.0) { return (torch::randn(shape) * scale).to(dtype); };
  std::vector<GluInputs> cases;
  cases.push_back({"[3, 7, 37] -> 19", r({3, 7, 37}, 3.0), r({3, 7, 37}), r({19, 37}, 0.2), r({3, 7, 19})});
  cases.push_back({"[37] -> 5", r({37}, 3.0), r({37}), r({5, 37}, 0.2), r({5})});
  cases.push_back({"[0, 37] -> 19", r({0, 37}), r({0, 37}), r({19, 37}, 0.2), r({0, 19})});
  auto gate_up = r({13, 2 * 45}, 3.0);
  cases.push_back({"gate_up halves [13, 45] -> 22, dy transposed", gate_up.narrow(-1, 0, 45),
                   gate_up.narrow(-1, 45, 45), r({22, 45}, 0.2), r({22, 13}).t()});
  cases.push_back({"transposed [29, 64] -> 33", r({64, 29}, 3.0).t(), r({64, 29}).t(), r({33, 64}, 0.2), r({29, 33})});
  return cases;
}

bool CpuMatmulSupports(torch::ScalarType dtype) {
  try {
    torch::ones({2, 2}, dtype).mm(torch::ones({2, 2}, dtype));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

TEST(GluLinear, BitIdenticalToThePreviousBackward) {
  torch::manual_seed(3);
  int compared = 0;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
    if (!CpuMatmulSupports(dtype)) continue;  // fp16 matmul on CPU is missing from some LibTorch builds
    for (bool gelu : {false, true}) {
      for (const auto& c : Inputs(dtype)) {
        const std::string tag = c10::toString(dtype) + std::string(gelu ? " geglu " : " swiglu ") + c.name;
        auto expected = PreviousGluLinear(gelu, c.a, c.b, c.w, c.dy);
        auto actual = RunGlu(true, gelu, c.a, c.b, c.w, {}, c.dy);
        EXPECT_TRUE(torch::equal(actual.y, expected.y)) << tag << ": y";
        EXPECT_TRUE(torch::equal(actual.da, expected.da)) << tag << ": da";
        EXPECT_TRUE(torch::equal(actual.db, expected.db)) << tag << ": db";
        EXPECT_TRUE(torch::equal(actual.dw, expected.dw)) << tag << ": dw";
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 30);  // fp32, float64 and bf16 at least
}

TEST(GluLinear, GradientsOfFrozenInputsAreSkippedAndTheRestUnchanged) {
  torch::manual_seed(4);
  for (bool gelu : {false, true}) {
    const auto c = Inputs(torch::kBFloat16)[0];
    auto expected = PreviousGluLinear(gelu, c.a, c.b, c.w, c.dy);
    // Frozen weight: no weight gradient, da and db as before.
    {
      auto a = c.a.clone().requires_grad_(true), b = c.b.clone().requires_grad_(true);
      tigon::ops::glu_linear(a, b, c.w, {}, gelu).backward(c.dy);
      EXPECT_TRUE(torch::equal(a.grad(), expected.da) && torch::equal(b.grad(), expected.db)) << gelu;
      EXPECT_FALSE(c.w.grad().defined());
    }
    // Frozen a and b (e.g. a frozen trunk): only the weight gradient, as before.
    {
      auto w = c.w.clone().requires_grad_(true);
      tigon::ops::glu_linear(c.a, c.b, w, {}, gelu).backward(c.dy);
      EXPECT_TRUE(torch::equal(w.grad(), expected.dw)) << gelu;
    }
  }
}

// Every dtype against float64 arithmetic on the same rounded inputs. Bounds relative to the largest entry:
// h and grad_h are rounded to the dtype before their matmuls (bf16 2^-8, fp16 2^-11 relative), and a CPU
// matmul may round its partial sums as well (fp16: a few roundings of 2^-11 over <= 64 terms).
TEST(GluLinear, CloseToFloat64OnRoundedInputs) {
  torch::manual_seed(5);
  const std::map<torch::ScalarType, double> tol = {
      {torch::kFloat, 1e-5}, {torch::kBFloat16, 2e-2}, {torch::kHalf, 1e-2}};
  for (const auto& [dtype, rel] : tol) {
    if (!CpuMatmulSupports(dtype)) continue;
    for (bool gelu : {false, true}) {
      for (const auto& c : Inputs(dtype)) {
        if (c.a.numel() == 0) continue;
        const std::string tag = c10::toString(dtype) + std::string(gelu ? " geglu " : " swiglu ") + c.name;
        auto f = RunGlu(true, gelu, c.a, c.b, c.w, {}, c.dy);
        auto r = RunGlu(false, gelu, c.a.to(torch::kDouble), c.b.to(torch::kDouble), c.w.to(torch::kDouble), {},
                        c.dy.to(torch::kDouble));
        for (const auto& [actual, expected, what] :
             std::vector<std::tuple<torch::Tensor, torch::Tensor, std::string>>{
                 {f.y, r.y, "y"}, {f.da, r.da, "da"}, {f.db, r.db, "db"}, {f.dw, r.dw, "dw"}}) {
          const double scale = expected.abs().max().item<double>();
          const double diff = (actual.to(torch::kDouble) - expected).abs().max().item<double>();
          EXPECT_LE(diff, rel * scale) << tag << ": " << what;
        }
      }
    }
  }
}

TEST(GluLinear, RegisteredTorchOpMatchesTheFunction) {
  torch::manual_seed(6);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::glu_linear", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                     const c10::optional<torch::Tensor>&, bool)>();
  auto a = torch::randn({5, 12}, torch::kDouble), b = torch::randn({5, 12}, torch::kDouble);
  auto w = torch::randn({7, 12}, torch::kDouble), bias = torch::randn({7}, torch::kDouble);
  EXPECT_TRUE(torch::equal(op.call(a, b, w, bias, true), tigon::ops::glu_linear(a, b, w, bias, true)));
  EXPECT_TRUE(torch::equal(op.call(a, b, w, c10::nullopt, false), tigon::ops::glu_linear(a, b, w, {}, false)));
}

}  // namespace

namespace {

// glu_linear_consuming_inputs on non-leaf a and b (as in the decoder: outputs of the projections), or plain
// glu_linear -> y, the gradients reaching the leaves a0, b0 and w (undefined unless weight_grad), and what a's
// and b's buffers hold afterwards.
struct ConsumingRun {
  torch::Tensor y, da, db, dw, a_after, b_after;
};

ConsumingRun RunConsuming(bool consuming, bool gelu, const torch::Tensor& a0, const torch::Tensor& b0,
                          const torch::Tensor& w0, const torch::Tensor& dy, bool contiguous_a, bool contiguous_b,
                          bool weight_grad) {
  auto a_leaf = a0.detach().clone().requires_grad_(true);
  auto b_leaf = b0.detach().clone().requires_grad_(true);
  auto w = w0.detach().clone().requires_grad_(weight_grad);
  // Contiguous, or strided: a column half of a wider product, as Phi3's fused gate_up gives.
  auto half_of_wider = [](const torch::Tensor& leaf) {
    return torch::cat({leaf, leaf}, -1).narrow(-1, leaf.size(-1), leaf.size(-1));
  };
  auto a = contiguous_a ? a_leaf * 1 : half_of_wider(a_leaf);
  auto b = contiguous_b ? b_leaf * 1 : half_of_wider(b_leaf);
  auto y = consuming ? tigon::ops::glu_linear_consuming_inputs(a, b, w, torch::Tensor(), gelu)
                     : tigon::ops::glu_linear(a, b, w, torch::Tensor(), gelu);
  y.backward(dy);
  return {y.detach(), a_leaf.grad(), b_leaf.grad(), w.grad(), a.detach().clone(), b.detach().clone()};
}

}  // namespace

// Consuming the inputs changes no value: y and every gradient equal plain glu_linear's bit for bit, whether
// backward takes h from the activation's backward pass (a contiguous, weight gradient asked for) or recomputes
// it. A contiguous input's buffer ends up holding its own gradient; a strided one (a view into a larger
// product) is left alone.
TEST(GluLinear, ConsumingInputsGivesTheSameResultsAndTakesTheirBuffers) {
  torch::manual_seed(17);
  for (const bool gelu : {false, true}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
      for (const bool contiguous_a : {true, false}) {
        for (const bool contiguous_b : {true, false}) {
          for (const bool weight_grad : {true, false}) {
            const auto opts = torch::TensorOptions().dtype(dtype);
            auto a = torch::randn({3, 7, 37}, opts) * 3, b = torch::randn({3, 7, 37}, opts);
            auto w = torch::randn({19, 37}, opts) * 0.1, dy = torch::randn({3, 7, 19}, opts);
            const auto plain = RunConsuming(false, gelu, a, b, w, dy, contiguous_a, contiguous_b, weight_grad);
            const auto taken = RunConsuming(true, gelu, a, b, w, dy, contiguous_a, contiguous_b, weight_grad);
            const std::string where = std::string(gelu ? "geglu " : "swiglu ") + c10::toString(dtype) +
                                      (contiguous_a ? " contiguous a" : " strided a") +
                                      (contiguous_b ? " contiguous b" : " strided b") +
                                      (weight_grad ? " with dW" : " without dW");
            EXPECT_TRUE(torch::equal(plain.y, taken.y)) << where;
            EXPECT_TRUE(torch::equal(plain.da, taken.da)) << where;
            EXPECT_TRUE(torch::equal(plain.db, taken.db)) << where;
            EXPECT_EQ(plain.dw.defined(), weight_grad) << where;
            if (weight_grad) EXPECT_TRUE(torch::equal(plain.dw, taken.dw)) << where << ": weight gradient";
            EXPECT_TRUE(torch::equal(plain.a_after, a) && torch::equal(plain.b_after, b)) << where << ": plain";
            // Over a only on the one-pass route (contiguous a, weight gradient wanted); b whenever contiguous.
            if (contiguous_a && weight_grad) {
              EXPECT_TRUE(torch::equal(taken.a_after, taken.da)) << where << ": a's buffer should hold its gradient";
            } else {
              EXPECT_TRUE(torch::equal(taken.a_after, a)) << where << ": a should be untouched";
            }
            if (contiguous_b) {
              EXPECT_TRUE(torch::equal(taken.b_after, taken.db)) << where << ": b's buffer should hold its gradient";
            } else {
              EXPECT_TRUE(torch::equal(taken.b_after, b)) << where << ": b should be untouched";
            }
          }
        }
      }
    }
  }
}

TEST(GluLinear, ConsumingInputsRefusesASecondBackwardThroughARetainedGraph) {
  torch::manual_seed(18);
  auto a_leaf = torch::randn({5, 12}).requires_grad_(true), b_leaf = torch::randn({5, 12}).requires_grad_(true);
  auto w = torch::randn({4, 12}).requires_grad_(true);
  auto y = tigon::ops::glu_linear_consuming_inputs(a_leaf * 1, b_leaf * 1, w, torch::Tensor(), false);
  auto loss = y.square().sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(loss.backward(), c10::Error);  // a and b were overwritten: their saved values are gone
}
