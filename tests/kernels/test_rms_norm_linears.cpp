// rms_norm_linears (projections of an RMSNorm's output with the norm recomputed in backward) against the
// composition rms_norm / add_rms_norm + at::linear, forward and every gradient, in float64 on fresh random
// inputs with odd shapes, 1 to 3 projections with and without biases, strided inputs, every casting mode.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace {

using tigon::RMSNormCasting;

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double diff = (actual.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>();
  const double scale = expected.abs().max().item<double>() + 1e-30;
  EXPECT_LE(diff, tol * scale) << what << ": max |diff| " << diff << " (scale " << scale << ")";
}

struct Case {
  std::vector<int64_t> lead;  // leading dims of x
  int64_t hidden;
  std::vector<int64_t> outs;  // out features per projection
  bool residual, biases, strided;
  RMSNormCasting casting;
  double offset;
};

void RunCase(const Case& c, torch::ScalarType dtype, double tol) {
  const std::string name = "hidden " + std::to_string(c.hidden) + ", " + std::to_string(c.outs.size()) +
                           " projections" + (c.residual ? ", residual" : "") + (c.biases ? ", biases" : "") +
                           (c.strided ? ", strided" : "") + ", casting " + std::to_string(static_cast<int>(c.casting));
  auto shape = c.lead;
  shape.push_back(c.hidden);
  auto opt = torch::TensorOptions().dtype(dtype);
  torch::Tensor x;
  if (c.strided) {  // the last two dims swapped in memory
    auto t = shape;
    std::swap(t[t.size() - 1], t[t.size() - 2]);
    x = torch::randn(t, opt).transpose(-1, -2);
  } else {
    x = torch::randn(shape, opt);
  }
  const auto residual = c.residual ? torch::randn(shape, opt) : torch::Tensor();
  const auto norm_w = torch::randn({c.hidden}, opt) * 0.3 + 1.0;
  std::vector<torch::Tensor> ws, bs;
  for (int64_t out : c.outs) {
    ws.push_back(torch::randn({out, c.hidden}, opt) * 0.1);
    bs.push_back(c.biases ? torch::randn({out}, opt) : torch::Tensor());
  }
  auto leaves = [&](std::vector<torch::Tensor>& all) {
    all = {x.detach().clone().requires_grad_(true), c.residual ? residual.clone().requires_grad_(true) : torch::Tensor(),
           norm_w.clone().requires_grad_(true)};
    for (auto& w : ws) all.push_back(w.clone().requires_grad_(true));
    for (auto& b : bs) all.push_back(b.defined() ? b.clone().requires_grad_(true) : torch::Tensor());
  };
  std::vector<torch::Tensor> a, e;
  leaves(a);
  leaves(e);
  const size_t n = ws.size();
  auto slice = [&](std::vector<torch::Tensor>& v, size_t first) {
    return std::vector<torch::Tensor>(v.begin() + first, v.begin() + first + n);
  };
  auto fused = tigon::ops::rms_norm_linears(a[0], a[1], a[2], 1e-6, c.offset, c.casting, slice(a, 3),
                                            c.biases ? slice(a, 3 + n) : std::vector<torch::Tensor>{});
  ASSERT_EQ(fused.size(), n + (c.residual ? 1 : 0)) << name;
  torch::Tensor y, h;
  if (c.residual) {
    std::tie(y, h) = tigon::ops::add_rms_norm(e[0], e[1], e[2], 1e-6, c.offset, c.casting);
  } else {
    y = tigon::ops::rms_norm(e[0], e[2], 1e-6, c.offset, c.casting);
  }
  std::vector<torch::Tensor> composed;
  for (size_t i = 0; i < n; ++i) composed.push_back(at::linear(y, e[3 + i], e[3 + n + i]));
  if (c.residual) composed.push_back(h);
  // A loss that weighs every output differently, so each gradient path is exercised.
  torch::Tensor loss_a = torch::zeros({}, opt), loss_e = torch::zeros({}, opt);
  for (size_t i = 0; i < composed.size(); ++i) {
    ExpectClose(fused[i], composed[i], tol, name + ": output " + std::to_string(i));
    const auto probe = torch::randn(composed[i].sizes(), opt);
    loss_a = loss_a + (fused[i] * probe).sum();
    loss_e = loss_e + (composed[i] * probe).sum();
  }
  loss_a.backward();
  loss_e.backward();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined()) continue;
    ExpectClose(a[i].grad(), e[i].grad(), tol, name + ": gradient of input " + std::to_string(i));
  }
}

TEST(RMSNormLinearsCpu, MatchesNormThenLinearInFloat64) {
  torch::manual_seed(17);
  const std::vector<Case> cases = {
      {{3, 5}, 24, {40, 8, 8}, false, false, false, RMSNormCasting::kLlama, 0.0},
      {{3, 5}, 24, {40, 8, 8}, true, true, false, RMSNormCasting::kLlama, 0.0},
      {{7}, 33, {66, 66}, true, false, true, RMSNormCasting::kGemma, 1.0},
      {{2, 3}, 16, {48}, true, true, true, RMSNormCasting::kNone, 0.0},
      {{1, 1}, 8, {5}, false, true, false, RMSNormCasting::kLlama, 0.5},
  };
  for (const auto& c : cases) RunCase(c, torch::kDouble, 1e-12);
}

TEST(RMSNormLinearsCpu, Float32CloseToTheComposition) {
  torch::manual_seed(18);
  RunCase({{4, 9}, 64, {64, 16, 16}, true, false, false, RMSNormCasting::kLlama, 0.0}, torch::kFloat, 1e-5);
}

TEST(RMSNormLinearsCpu, UnusedOutputsAndBadArgumentsAreHandled) {
  torch::manual_seed(19);
  auto x = torch::randn({4, 8}, torch::kDouble).requires_grad_(true);
  auto w = torch::ones({8}, torch::kDouble).requires_grad_(true);
  auto q = torch::randn({8, 8}, torch::kDouble).requires_grad_(true);
  auto k = torch::randn({4, 8}, torch::kDouble).requires_grad_(true);
  auto outs = tigon::ops::rms_norm_linears(x, {}, w, 1e-6, 0.0, RMSNormCasting::kLlama, {q, k});
  outs[0].sum().backward();  // k's output unused: no gradient for k, the rest as if k were absent
  EXPECT_FALSE(k.grad().defined() && k.grad().abs().sum().item<double>() != 0.0);
  EXPECT_TRUE(q.grad().defined());
  EXPECT_TRUE(x.grad().defined());
  EXPECT_THROW(tigon::ops::rms_norm_linears(x, {}, w, 1e-6, 0.0, RMSNormCasting::kLlama, {}), c10::Error);
  EXPECT_THROW(tigon::ops::rms_norm_linears(x, {}, w, 1e-6, 0.0, RMSNormCasting::kLlama,
                                            {torch::randn({3, 5}, torch::kDouble)}),
               c10::Error);
}

// The backward's products written out in the order they are taken (the weight gradients from the recomputed
// norm, dy accumulated with addmm_, then the norm's own backward through the autograd rms_norm /
// add_rms_norm): rms_norm_linears must give these bit for bit, whatever it frees in between.
TEST(RMSNormLinearsCpu, BitIdenticalToItsProductsWrittenOut) {
  torch::manual_seed(20);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool residual : {false, true}) {
      for (bool frozen_weights : {false, true}) {
        const std::string tag = std::string(c10::toString(dtype)) + (residual ? " residual" : "") +
                                (frozen_weights ? " frozen weights" : "");
        auto opt = torch::TensorOptions().dtype(dtype);
        auto x = torch::randn({3, 11, 40}, opt), res = torch::randn({3, 11, 40}, opt);
        auto norm_w = (torch::randn({40}) * 0.3 + 1.0).to(dtype);
        std::vector<torch::Tensor> ws = {(torch::randn({56, 40}) * 0.1).to(dtype),
                                         (torch::randn({24, 40}) * 0.1).to(dtype)};
        std::vector<torch::Tensor> gs = {torch::randn({3, 11, 56}, opt), torch::randn({3, 11, 24}, opt)};
        auto g_res = torch::randn({3, 11, 40}, opt);

        auto xa = x.clone().requires_grad_(true), ra = res.clone().requires_grad_(true);
        auto nwa = norm_w.clone().requires_grad_(true);
        std::vector<torch::Tensor> wa = {ws[0].clone().requires_grad_(!frozen_weights),
                                         ws[1].clone().requires_grad_(!frozen_weights)};
        auto outs = tigon::ops::rms_norm_linears(xa, residual ? ra : torch::Tensor(), nwa, 1e-6, 0.0,
                                                 RMSNormCasting::kLlama, wa);
        std::vector<torch::Tensor> grads = gs;
        if (residual) grads.push_back(g_res);
        torch::autograd::backward(outs, grads);

        auto xe = x.clone().requires_grad_(true), re = res.clone().requires_grad_(true);
        auto nwe = norm_w.clone().requires_grad_(true);
        torch::Tensor y, h;
        if (residual) {
          std::tie(y, h) = tigon::ops::add_rms_norm(xe, re, nwe, 1e-6, 0.0, RMSNormCasting::kLlama);
        } else {
          y = tigon::ops::rms_norm(xe, nwe, 1e-6, 0.0, RMSNormCasting::kLlama);
        }
        auto y2d = y.detach().reshape({-1, 40});
        auto dy = gs[0].reshape({-1, 56}).mm(ws[0]);
        dy.addmm_(gs[1].reshape({-1, 24}), ws[1]);
        if (residual) {
          torch::autograd::backward({y, h}, {dy.view(y.sizes()), g_res});
        } else {
          y.backward(dy.view(y.sizes()));
        }
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_TRUE(torch::equal(outs[i], at::linear(y2d, ws[i]).view(outs[i].sizes()))) << tag << ": output " << i;
          if (frozen_weights) {
            EXPECT_FALSE(wa[i].grad().defined()) << tag;
          } else {
            EXPECT_TRUE(torch::equal(wa[i].grad(), gs[i].reshape({-1, ws[i].size(0)}).t().mm(y2d)))
                << tag << ": dw" << i;
          }
        }
        EXPECT_TRUE(torch::equal(xa.grad(), xe.grad())) << tag << ": dx";
        EXPECT_TRUE(torch::equal(nwa.grad(), nwe.grad())) << tag << ": dweight";
        if (residual) EXPECT_TRUE(torch::equal(ra.grad(), re.grad())) << tag << ": dresidual";
      }
    }
  }
}

// torch.ops.tigon.rms_norm_linears (what Python calls) runs the same function: outputs and gradients equal,
// with and without a residual and biases.
TEST(RMSNormLinears, RegisteredTorchOpMatchesTheFunction) {
  torch::manual_seed(11);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::rms_norm_linears", "")
                .typed<std::vector<torch::Tensor>(const torch::Tensor&, const c10::optional<torch::Tensor>&,
                                                  const torch::Tensor&, double, double, int64_t, at::TensorList,
                                                  const c10::List<c10::optional<torch::Tensor>>&)>();
  const auto opt = torch::TensorOptions().dtype(torch::kDouble);
  const auto x = torch::randn({3, 5, 16}, opt), res = torch::randn({3, 5, 16}, opt);
  const auto norm_w = torch::randn({16}, opt) + 1.0;
  const std::vector<torch::Tensor> ws = {torch::randn({7, 16}, opt), torch::randn({9, 16}, opt)};
  const auto bias = torch::randn({9}, opt);
  for (bool residual : {false, true}) {
    for (int casting : {0, 1}) {
      const std::string tag = std::string(residual ? "residual" : "no residual") + ", casting " +
                              std::to_string(casting);
      auto run = [&](bool through_dispatcher) {
        auto xl = x.clone().requires_grad_(true), rl = res.clone().requires_grad_(true);
        auto wl = norm_w.clone().requires_grad_(true);
        std::vector<torch::Tensor> outs;
        if (through_dispatcher) {
          c10::List<c10::optional<torch::Tensor>> biases;
          biases.push_back(c10::nullopt);
          biases.push_back(bias);
          outs = op.call(xl, residual ? c10::optional<torch::Tensor>(rl) : c10::nullopt, wl, 1e-6, 1.0, casting, ws,
                         biases);
        } else {
          outs = tigon::ops::rms_norm_linears(xl, residual ? rl : torch::Tensor(), wl, 1e-6, 1.0,
                                              static_cast<RMSNormCasting>(casting), ws, {torch::Tensor(), bias});
        }
        torch::Tensor loss = torch::zeros({}, opt);
        for (size_t i = 0; i < outs.size(); ++i) loss = loss + (outs[i] * (static_cast<double>(i) + 0.5)).sum();
        loss.backward();
        outs.push_back(xl.grad());
        outs.push_back(wl.grad());
        if (residual) outs.push_back(rl.grad());
        return outs;
      };
      const auto direct = run(false), dispatched = run(true);
      ASSERT_EQ(direct.size(), dispatched.size()) << tag;
      ASSERT_EQ(direct.size(), residual ? 6u : 4u) << tag;
      for (size_t i = 0; i < direct.size(); ++i) EXPECT_TRUE(torch::equal(direct[i], dispatched[i])) << tag << ": " << i;
    }
  }
}

}  // namespace
