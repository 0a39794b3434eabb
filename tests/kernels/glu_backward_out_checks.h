// The checks of swiglu_backward_out / geglu_backward_out (the GLU backward outside autograd, da written over
// dy), run by test_glu.cpp for each activation: each takes the op's fused forward, fused backward_out and
// float64 reference backward_out, so both ops run the same cases and assertions.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/kernels/expect_close.h"

namespace glu_backward_out_checks {

using tigon_test::ExpectClose;

using GluForward = torch::Tensor (*)(const torch::Tensor& a, const torch::Tensor& b);
using GluBackwardOut = void (*)(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                                const torch::Tensor& da, const torch::Tensor& db);
// The fused one also takes h (undefined: not written), which receives the forward's output.
using FusedGluBackwardOut = void (*)(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                                     const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h);

// One gated activation: e.g. {tigon::ops::swiglu, tigon::ops::swiglu_backward_out,
// tigon::reference::swiglu_backward_out}.
struct GluOp {
  GluForward fused;
  FusedGluBackwardOut fused_backward_out;
  GluBackwardOut reference_backward_out;
};

// (a, b) in the layouts the MLP hands over: plain, the strided halves of one gate_up projection, transposed.
inline std::vector<std::pair<std::string, std::pair<torch::Tensor, torch::Tensor>>> Operands(
    torch::ScalarType dtype) {
  auto opts = torch::TensorOptions().dtype(dtype);
  auto gate_up = (torch::randn({6, 2 * 45}) * 4.0).to(dtype);
  auto halves = gate_up.chunk(2, -1);
  return {{"[5, 4095]", {(torch::randn({5, 4095}) * 4.0).to(dtype), torch::randn({5, 4095}, opts)}},
          {"[2, 3, 37]", {(torch::randn({2, 3, 37}) * 4.0).to(dtype), torch::randn({2, 3, 37}, opts)}},
          {"[1]", {(torch::randn({1}) * 4.0).to(dtype), torch::randn({1}, opts)}},
          {"gate_up halves [6, 45]", {halves[0], halves[1]}},
          {"transposed [13, 37]", {(torch::randn({37, 13}) * 4.0).to(dtype).t(), torch::randn({37, 13}, opts).t()}}};
}

inline const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16,
                                                       torch::kHalf};

// In place over dy and over owned copies of a and b: bit for bit what autograd through op.fused returns.
inline void ExpectBackwardOutInPlaceBitIdenticalToAutograd(const GluOp& op) {
  for (auto dtype : kDtypes) {
    for (const auto& [name, ab] : Operands(dtype)) {
      const auto& [a, b] = ab;
      const std::string tag = c10::toString(dtype) + std::string(" ") + name;
      auto dy = torch::randn(a.sizes()).to(dtype);
      auto a_leaf = a.detach().requires_grad_(true), b_leaf = b.detach().requires_grad_(true);
      auto g = torch::autograd::grad({op.fused(a_leaf, b_leaf)}, {a_leaf, b_leaf}, {dy});
      // da over dy (the caller owns it), db fresh.
      auto da = dy.clone(), db = torch::empty_like(da);
      op.fused_backward_out(da, a, b, da, db, {});
      EXPECT_TRUE(torch::equal(da, g[0])) << tag << ": da in place";
      EXPECT_TRUE(torch::equal(db, g[1])) << tag << ": db";
      // Over owned copies of a and b (contiguous: the outputs' layout), against autograd on the same copies.
      auto a_own = a.contiguous().clone(), b_own = b.contiguous().clone();
      auto a_own_leaf = a_own.detach().clone().requires_grad_(true);
      auto b_own_leaf = b_own.detach().clone().requires_grad_(true);
      auto g_own = torch::autograd::grad({op.fused(a_own_leaf, b_own_leaf)}, {a_own_leaf, b_own_leaf}, {dy});
      op.fused_backward_out(dy, a_own, b_own, a_own, b_own, {});
      EXPECT_TRUE(torch::equal(a_own, g_own[0])) << tag << ": da over a";
      EXPECT_TRUE(torch::equal(b_own, g_own[1])) << tag << ": db over b";
    }
  }
}

// h, from the same pass as da and db, equals the fused forward's output bit for bit, in the layouts
// glu_linear uses: h over dy with da and db over owned copies of a and b, and h fresh beside fresh da, db.
// da and db stay bit-identical to autograd's.
inline void ExpectBackwardOutWritesTheForwardOutput(const GluOp& op) {
  for (auto dtype : kDtypes) {
    for (const auto& [name, ab] : Operands(dtype)) {
      const auto& [a, b] = ab;
      const std::string tag = c10::toString(dtype) + std::string(" ") + name;
      const auto y = op.fused(a, b);
      auto dy = torch::randn(a.sizes()).to(dtype);
      auto a_leaf = a.detach().requires_grad_(true), b_leaf = b.detach().requires_grad_(true);
      auto g = torch::autograd::grad({op.fused(a_leaf, b_leaf)}, {a_leaf, b_leaf}, {dy});
      auto da = torch::empty(a.sizes(), a.options()), db = torch::empty_like(da), h = torch::empty_like(da);
      op.fused_backward_out(dy, a, b, da, db, h);
      EXPECT_TRUE(torch::equal(h, y)) << tag << ": h (fresh)";
      EXPECT_TRUE(torch::equal(da, g[0]) && torch::equal(db, g[1])) << tag << ": da, db beside h";
      // Every output over an input: h over dy, da over a, db over b (owned contiguous copies, against the
      // forward and autograd on the same copies: CPU math may round a strided operand differently).
      auto dy_own = dy.clone(), a_own = a.contiguous().clone(), b_own = b.contiguous().clone();
      const auto y_own = op.fused(a_own, b_own);
      auto a_own_leaf = a_own.detach().clone().requires_grad_(true);
      auto b_own_leaf = b_own.detach().clone().requires_grad_(true);
      auto g_own = torch::autograd::grad({op.fused(a_own_leaf, b_own_leaf)}, {a_own_leaf, b_own_leaf}, {dy});
      op.fused_backward_out(dy_own, a_own, b_own, a_own, b_own, dy_own);
      EXPECT_TRUE(torch::equal(dy_own, y_own)) << tag << ": h over dy";
      EXPECT_TRUE(torch::equal(a_own, g_own[0]) && torch::equal(b_own, g_own[1])) << tag << ": da, db over a, b";
    }
  }
}

// Against op.reference_backward_out in float64 on the same rounded inputs. Tolerances: fp32 math, then one
// rounding of each output (bf16 2^-8, fp16 2^-11 relative), with an absolute floor for the cancellation
// each activation's derivative has (named where the op's test calls this).
inline void ExpectBackwardOutMatchesReferenceInFloat64(const GluOp& op) {
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
      op.reference_backward_out(dy.to(torch::kDouble), a.to(torch::kDouble), b.to(torch::kDouble), da_ref, db_ref);
      auto da = dy.clone(), db = torch::empty_like(da);
      op.fused_backward_out(da, a, b, da, db, {});
      ExpectClose(da, da_ref, atol, rtol, tag + ": da");
      ExpectClose(db, db_ref, atol, rtol, tag + ": db");
      // The reference computes both gradients before storing either: in place over dy it agrees with itself.
      auto dy64 = dy.to(torch::kDouble), db64 = torch::empty_like(dy64);
      op.reference_backward_out(dy64, a.to(torch::kDouble), b.to(torch::kDouble), dy64, db64);
      EXPECT_TRUE(torch::equal(dy64, da_ref) && torch::equal(db64, db_ref)) << tag << ": reference in place";
    }
  }
}

// Overlapping, aliased, non-contiguous, wrong-dtype and wrong-shape outputs throw; the valid call does not.
inline void ExpectBackwardOutRejectsBadOutputs(FusedGluBackwardOut backward_out) {
  auto a = torch::randn({4, 8}), b = torch::randn({4, 8}), dy = torch::randn({4, 8});
  auto db = torch::empty({4, 8});
  // An output that overlaps an input without being it element for element.
  auto storage = torch::randn({33});
  auto dy_view = storage.narrow(0, 0, 32).view({4, 8}), da_shifted = storage.narrow(0, 1, 32).view({4, 8});
  EXPECT_THROW(backward_out(dy_view, a, b, da_shifted, db, {}), c10::Error);
  // da and db the same memory.
  auto da = torch::empty({4, 8});
  EXPECT_THROW(backward_out(dy, a, b, da, da, {}), c10::Error);
  // Non-contiguous, wrong dtype, wrong shape.
  EXPECT_THROW(backward_out(dy, a, b, torch::empty({8, 4}).t(), db, {}), c10::Error);
  EXPECT_THROW(backward_out(dy, a, b, torch::empty({4, 8}, torch::kDouble), db, {}), c10::Error);
  EXPECT_THROW(backward_out(dy, a, b, torch::empty({4, 9}), db, {}), c10::Error);
  EXPECT_THROW(backward_out(dy.to(torch::kDouble), a, b, da, db, {}), c10::Error);
  // h: apart from da and db, contiguous, a's shape.
  auto h = torch::empty({4, 8});
  EXPECT_THROW(backward_out(dy, a, b, da, db, da), c10::Error);
  EXPECT_THROW(backward_out(dy, a, b, da, db, db), c10::Error);
  EXPECT_THROW(backward_out(dy, a, b, da, db, torch::empty({8, 4}).t()), c10::Error);
  EXPECT_THROW(backward_out(dy, a, b, da, db, torch::empty({4, 9})), c10::Error);
  EXPECT_THROW(backward_out(dy_view, a, b, da, db, da_shifted), c10::Error);
  // The valid calls still work: da in place over dy; h over dy with da and db over a and b.
  EXPECT_NO_THROW(backward_out(dy, a, b, dy, db, {}));
  EXPECT_NO_THROW(backward_out(dy, a, b, a, b, dy));
}

}  // namespace glu_backward_out_checks
