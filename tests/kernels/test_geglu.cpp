// GeGLU, gelu_tanh(a) * b: the fused CPU path (tigon::ops) against Hugging Face's gelu_pytorch_tanh(gate) * up
// (tigon::reference), forward and gradients, on odd shapes and on the strided halves of one fused
// gate_up projection (as in fused gate_up checkpoints).
// geglu_backward_out (the same backward outside autograd, da written over dy) against the autograd backward
// bit for bit and against the float64 reference, in fp32, float64, bf16 and fp16.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace {

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  auto a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  auto excess = (a - e).abs() - (atol + rtol * e.abs());
  const double worst = excess.max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": max |diff| " << (a - e).abs().max().item<double>() << " beyond tolerance by "
                        << worst;
}

const std::vector<std::vector<int64_t>> kShapes = {{5, 4095}, {1, 14}, {2, 3, 37}, {1}};

TEST(GeGLUCpu, ForwardMatchesReference) {
  torch::manual_seed(501);
  for (const auto& shape : kShapes) {
    // Wide range of gate values: gelu saturates on both sides.
    auto a = torch::randn(shape) * 4.0;
    auto b = torch::randn(shape);
    ExpectClose(tigon::ops::geglu(a, b), tigon::reference::geglu(a.to(torch::kDouble), b.to(torch::kDouble)),
                // fp32: tanh, a few products, a few ulps (1e-5 relative); atol for gelu(a) ~ 0.
                1e-6, 1e-5, "fp32 " + c10::str(c10::IntArrayRef(shape)));
    auto a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    auto fused16 = tigon::ops::geglu(a16, b16);
    EXPECT_EQ(fused16.scalar_type(), torch::kBFloat16);
    // bf16: computed in fp32 from the bf16 inputs and rounded once (2^-8 relative).
    ExpectClose(fused16, tigon::reference::geglu(a16.to(torch::kDouble), b16.to(torch::kDouble)), 1e-3, 1e-2,
                "bf16 " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST(GeGLUCpu, GradientsMatchReferenceAutogradFloat64) {
  torch::manual_seed(502);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& shape : kShapes) {
    auto a = (torch::randn(shape, opts) * 4.0).requires_grad_(true);
    auto b = torch::randn(shape, opts).requires_grad_(true);
    auto dy = torch::randn(shape, opts);
    auto fused = tigon::ops::geglu(a, b);
    auto ref = tigon::reference::geglu(a, b);
    ExpectClose(fused, ref, 1e-13, 1e-12, "forward");
    auto g = torch::autograd::grad({fused}, {a, b}, {dy});
    auto g_ref = torch::autograd::grad({ref}, {a, b}, {dy});
    ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "da " + c10::str(c10::IntArrayRef(shape)));
    ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "db " + c10::str(c10::IntArrayRef(shape)));
  }
}

TEST(GeGLUCpu, StridedHalvesOfAFusedProjection) {
  torch::manual_seed(503);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto gate_up = torch::randn({6, 2 * 45}, opts).requires_grad_(true);
  auto halves = gate_up.chunk(2, -1);
  auto a = halves[0], b = halves[1];
  ASSERT_FALSE(a.is_contiguous());
  auto dy = torch::randn({45, 6}, opts).t();  // and a transposed incoming gradient
  auto fused = tigon::ops::geglu(a, b);
  auto ref = tigon::reference::geglu(a, b);
  ExpectClose(fused, ref, 1e-13, 1e-12, "strided forward");
  auto g = torch::autograd::grad({fused}, {gate_up}, {dy});
  auto g_ref = torch::autograd::grad({ref}, {gate_up}, {dy});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "d gate_up");
}

TEST(GeGLUCpu, Bf16GradientsWithinTolerance) {
  torch::manual_seed(504);
  auto a = (torch::randn({17, 301}) * 3.0).to(torch::kBFloat16).requires_grad_(true);
  auto b = torch::randn({17, 301}).to(torch::kBFloat16).requires_grad_(true);
  auto dy = torch::randn({17, 301}).to(torch::kBFloat16);
  auto ar = a.detach().to(torch::kDouble).requires_grad_(true);
  auto br = b.detach().to(torch::kDouble).requires_grad_(true);
  auto g = torch::autograd::grad({tigon::ops::geglu(a, b)}, {a, b}, {dy});
  auto g_ref = torch::autograd::grad({tigon::reference::geglu(ar, br)}, {ar, br}, {dy.to(torch::kDouble)});
  // fp32 math from bf16 inputs, one rounding of each gradient (2^-8 relative).
  ExpectClose(g[0], g_ref[0], 1e-3, 1e-2, "bf16 da");
  ExpectClose(g[1], g_ref[1], 1e-3, 1e-2, "bf16 db");
}

TEST(GeGLUCpu, RegisteredTorchOpRunsWithAutograd) {
  torch::manual_seed(505);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::geglu", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>();
  auto a = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto b = torch::randn({3, 10}, torch::kDouble).requires_grad_(true);
  auto y = op.call(a, b);
  auto y_ref = tigon::reference::geglu(a, b);
  ExpectClose(y, y_ref, 1e-13, 1e-12, "torch op forward");
  auto g = torch::autograd::grad({y.sum()}, {a, b});
  auto g_ref = torch::autograd::grad({y_ref.sum()}, {a, b});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "torch op da");
  ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "torch op db");
}

TEST(GeGLUCpu, RejectsMismatchedInputs) {
  EXPECT_THROW(tigon::ops::geglu(torch::randn({2, 3}), torch::randn({2, 4})), c10::Error);
  EXPECT_THROW(tigon::ops::geglu(torch::randn({2, 3}), torch::randn({2, 3}).to(torch::kBFloat16)), c10::Error);
}

// ---- geglu_backward_out: the backward outside autograd, in place over dy ------------------------------

// (a, b) in the layouts the MLP hands over: plain, the strided halves of one gate_up projection, transposed.
std::vector<std::pair<std::string, std::pair<torch::Tensor, torch::Tensor>>> Operands(torch::ScalarType dtype) {
  auto opts = torch::TensorOptions().dtype(dtype);
  auto gate_up = (torch::randn({6, 2 * 45}) * 4.0).to(dtype);
  auto halves = gate_up.chunk(2, -1);
  return {{"[5, 4095]", {(torch::randn({5, 4095}) * 4.0).to(dtype), torch::randn({5, 4095}, opts)}},
          {"[2, 3, 37]", {(torch::randn({2, 3, 37}) * 4.0).to(dtype), torch::randn({2, 3, 37}, opts)}},
          {"[1]", {(torch::randn({1}) * 4.0).to(dtype), torch::randn({1}, opts)}},
          {"gate_up halves [6, 45]", {halves[0], halves[1]}},
          {"transposed [13, 37]", {(torch::randn({37, 13}) * 4.0).to(dtype).t(), torch::randn({37, 13}, opts).t()}}};
}

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf};

TEST(GeGLUCpu, BackwardOutInPlaceIsBitIdenticalToAutograd) {
  torch::manual_seed(506);
  for (auto dtype : kDtypes) {
    for (const auto& [name, ab] : Operands(dtype)) {
      const auto& [a, b] = ab;
      const std::string tag = c10::toString(dtype) + std::string(" ") + name;
      auto dy = torch::randn(a.sizes()).to(dtype);
      auto a_leaf = a.detach().requires_grad_(true), b_leaf = b.detach().requires_grad_(true);
      auto g = torch::autograd::grad({tigon::ops::geglu(a_leaf, b_leaf)}, {a_leaf, b_leaf}, {dy});
      // da over dy (the caller owns it), db fresh.
      auto da = dy.clone(), db = torch::empty_like(da);
      tigon::ops::geglu_backward_out(da, a, b, da, db);
      EXPECT_TRUE(torch::equal(da, g[0])) << tag << ": da in place";
      EXPECT_TRUE(torch::equal(db, g[1])) << tag << ": db";
      // Over owned copies of a and b (contiguous: the outputs' layout), against autograd on the same copies.
      auto a_own = a.contiguous().clone(), b_own = b.contiguous().clone();
      auto a_own_leaf = a_own.detach().clone().requires_grad_(true);
      auto b_own_leaf = b_own.detach().clone().requires_grad_(true);
      auto g_own = torch::autograd::grad({tigon::ops::geglu(a_own_leaf, b_own_leaf)}, {a_own_leaf, b_own_leaf}, {dy});
      tigon::ops::geglu_backward_out(dy, a_own, b_own, a_own, b_own);
      EXPECT_TRUE(torch::equal(a_own, g_own[0])) << tag << ": da over a";
      EXPECT_TRUE(torch::equal(b_own, g_own[1])) << tag << ": db over b";
    }
  }
}

TEST(GeGLUCpu, BackwardOutMatchesReferenceInFloat64) {
  torch::manual_seed(507);
  // Tolerances against the float64 reference on the same rounded inputs: fp32 math, then one rounding of
  // each output (bf16 2^-8, fp16 2^-11 relative); da = dy b gelu'(a) has a cancellation in
  // s + 2 a s (1 - s) u'(a) for negative a, hence an absolute floor.
  const std::map<torch::ScalarType, std::pair<double, double>> tol = {{torch::kDouble, {1e-12, 1e-10}},
                                                                     {torch::kFloat, {1e-5, 1e-5}},
                                                                     {torch::kBFloat16, {1e-3, 1e-2}},
                                                                     {torch::kHalf, {1e-3, 5e-3}}};
  for (auto dtype : kDtypes) {
    const auto [atol, rtol] = tol.at(dtype);
    for (const auto& [name, ab] : Operands(dtype)) {
      const auto& [a, b] = ab;
      const std::string tag = c10::toString(dtype) + std::string(" ") + name;
      auto dy = torch::randn(a.sizes()).to(dtype);
      auto da_ref = torch::empty(a.sizes(), torch::kDouble), db_ref = torch::empty_like(da_ref);
      tigon::reference::geglu_backward_out(dy.to(torch::kDouble), a.to(torch::kDouble), b.to(torch::kDouble), da_ref,
                                            db_ref);
      auto da = dy.clone(), db = torch::empty_like(da);
      tigon::ops::geglu_backward_out(da, a, b, da, db);
      ExpectClose(da, da_ref, atol, rtol, tag + ": da");
      ExpectClose(db, db_ref, atol, rtol, tag + ": db");
      // The reference computes both gradients before storing either: in place over dy it agrees with itself.
      auto dy64 = dy.to(torch::kDouble), db64 = torch::empty_like(dy64);
      tigon::reference::geglu_backward_out(dy64, a.to(torch::kDouble), b.to(torch::kDouble), dy64, db64);
      EXPECT_TRUE(torch::equal(dy64, da_ref) && torch::equal(db64, db_ref)) << tag << ": reference in place";
    }
  }
}

TEST(GeGLUCpu, BackwardOutRejectsBadOutputs) {
  auto a = torch::randn({4, 8}), b = torch::randn({4, 8}), dy = torch::randn({4, 8});
  auto db = torch::empty({4, 8});
  // An output that overlaps an input without being it element for element.
  auto storage = torch::randn({33});
  auto dy_view = storage.narrow(0, 0, 32).view({4, 8}), da_shifted = storage.narrow(0, 1, 32).view({4, 8});
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy_view, a, b, da_shifted, db), c10::Error);
  // da and db the same memory.
  auto da = torch::empty({4, 8});
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy, a, b, da, da), c10::Error);
  // Non-contiguous, wrong dtype, wrong shape.
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy, a, b, torch::empty({8, 4}).t(), db), c10::Error);
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy, a, b, torch::empty({4, 8}, torch::kDouble), db), c10::Error);
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy, a, b, torch::empty({4, 9}), db), c10::Error);
  EXPECT_THROW(tigon::ops::geglu_backward_out(dy.to(torch::kDouble), a, b, da, db), c10::Error);
  // The valid call still works: da in place over dy.
  EXPECT_NO_THROW(tigon::ops::geglu_backward_out(dy, a, b, dy, db));
}

}  // namespace
