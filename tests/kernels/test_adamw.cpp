// Fused AdamW (CPU path) against the reference (torch.optim.AdamW's single-tensor update written with the
// same ATen ops) over several steps, and against a textbook AdamW written out here in double.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "kernels/torch_compat.h"

namespace tigon {
namespace {

struct AdamWBuffers {
  torch::Tensor param, exp_avg, exp_avg_sq, param_copy;
};

AdamWBuffers MakeAdamWBuffers(int64_t n, torch::ScalarType param_dtype, torch::ScalarType state_dtype, uint64_t seed) {
  torch::manual_seed(seed);
  AdamWBuffers b;
  b.param = torch::randn({n}, torch::kDouble).to(param_dtype);
  b.exp_avg = torch::zeros({n}, state_dtype);
  b.exp_avg_sq = torch::zeros({n}, state_dtype);
  return b;
}

AdamWBuffers Clone(const AdamWBuffers& b) {
  return {b.param.clone(), b.exp_avg.clone(), b.exp_avg_sq.clone(),
          b.param_copy.defined() ? b.param_copy.clone() : torch::Tensor()};
}

AdamWOptions Options(int64_t step) {
  AdamWOptions o;
  o.lr = 3e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.step = step;
  o.grad_scale = 0.5;
  return o;
}

// Bit-identical on LibTorch 1.13 (CI), whose CPU kernels round as the fused loop does. LibTorch 2.x
// vectorises the reference's lerp and addcdiv differently on CPU (measured on 2.11: results one fp32 ulp
// apart), so there the check allows two ulps.
void ExpectMatchesReference(const torch::Tensor& fused, const torch::Tensor& ref, const char* what) {
#if TIGON_TORCH_AT_LEAST(2, 0)
  EXPECT_TRUE(torch::allclose(fused, ref, /*rtol=*/2.4e-7, /*atol=*/0.0))
      << what << ": max |diff| " << (fused - ref).abs().max().item<double>();
#else
  EXPECT_TRUE(torch::equal(fused, ref)) << what << ": max |diff| " << (fused - ref).abs().max().item<double>();
#endif
}

// Steps both implementations `steps` times on the same fresh gradients (grad dtype `grad_dtype`).
void StepBoth(AdamWBuffers& fused, AdamWBuffers& ref, int steps, torch::ScalarType grad_dtype,
              AdamWOptions (*options)(int64_t) = Options) {
  for (int s = 1; s <= steps; ++s) {
    const torch::Tensor grad = (torch::randn(fused.param.sizes(), torch::kDouble) * 0.1).to(grad_dtype);
    ops::adamw_step(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, options(s), fused.param_copy);
    reference::adamw_step(ref.param, grad, ref.exp_avg, ref.exp_avg_sq, options(s), ref.param_copy);
  }
}

// fp32 everything: the fused loop performs torch's ops in torch's order with the same fp32 scalars, so
// the results are bit-identical to the reference.
TEST(AdamWCpu, Float32BitIdenticalToReferenceOverSteps) {
  AdamWBuffers fused = MakeAdamWBuffers(10007, torch::kFloat, torch::kFloat, 1);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 5, torch::kFloat);
  ExpectMatchesReference(fused.param, ref.param, "param");
  ExpectMatchesReference(fused.exp_avg, ref.exp_avg, "exp_avg");
  ExpectMatchesReference(fused.exp_avg_sq, ref.exp_avg_sq, "exp_avg_sq");
}

// beta1 < 0.5 takes lerp's other branch (weight 1 - beta1 >= 0.5).
TEST(AdamWCpu, SmallBeta1TakesTheOtherLerpBranch) {
  AdamWBuffers fused = MakeAdamWBuffers(999, torch::kFloat, torch::kFloat, 2);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 3, torch::kFloat, [](int64_t step) {
    AdamWOptions o = Options(step);
    o.beta1 = 0.3;
    return o;
  });
  ExpectMatchesReference(fused.param, ref.param, "param");
  ExpectMatchesReference(fused.exp_avg, ref.exp_avg, "exp_avg");
}

// bf16 parameters with fp32 gradients and fp32 state: fp32 math on both sides, one rounding to bf16 at
// the end, so still bit-identical.
TEST(AdamWCpu, BFloat16ParamWithFloat32GradAndState) {
  AdamWBuffers fused = MakeAdamWBuffers(4099, torch::kBFloat16, torch::kFloat, 3);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 4, torch::kFloat);
  ExpectMatchesReference(fused.param, ref.param, "param");
  ExpectMatchesReference(fused.exp_avg_sq, ref.exp_avg_sq, "exp_avg_sq");
}

// The `bf16` precision policy: parameters, gradients and both moments in bf16.
TEST(AdamWCpu, AllBFloat16) {
  AdamWBuffers fused = MakeAdamWBuffers(4099, torch::kBFloat16, torch::kBFloat16, 4);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 4, torch::kBFloat16);
  ExpectMatchesReference(fused.param, ref.param, "param");
  ExpectMatchesReference(fused.exp_avg, ref.exp_avg, "exp_avg");
  ExpectMatchesReference(fused.exp_avg_sq, ref.exp_avg_sq, "exp_avg_sq");
}

// `bf16_mixed`: fp32 master weights and state, bf16 gradients, and the bf16 model weights refreshed from
// the master through param_copy.
TEST(AdamWCpu, Float32MasterWithBFloat16ParamCopy) {
  AdamWBuffers fused = MakeAdamWBuffers(3001, torch::kFloat, torch::kFloat, 5);
  fused.param_copy = torch::zeros({3001}, torch::kBFloat16);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 3, torch::kBFloat16);
  ExpectMatchesReference(fused.param, ref.param, "param");
  EXPECT_TRUE(torch::equal(fused.param_copy, fused.param.to(torch::kBFloat16)));
  ExpectMatchesReference(fused.param_copy, ref.param_copy, "param_copy");
}

TEST(AdamWCpu, HalfParam) {
  AdamWBuffers fused = MakeAdamWBuffers(777, torch::kHalf, torch::kFloat, 6);
  AdamWBuffers ref = Clone(fused);
  StepBoth(fused, ref, 3, torch::kHalf);
  ExpectMatchesReference(fused.param, ref.param, "param");
}

// Against AdamW written out from its definition, in double, after 6 steps. The float64 fused path
// differs only by rounding (1e-12); the fp32 path by fp32 rounding accumulated over 6 steps (1e-5 relative).
TEST(AdamWCpu, MatchesTextbookAdamW) {
  const int64_t n = 513;
  torch::manual_seed(7);
  const torch::Tensor p0 = torch::randn({n}, torch::kDouble);
  std::vector<torch::Tensor> grads;
  for (int s = 0; s < 6; ++s) grads.push_back(torch::randn({n}, torch::kDouble));

  torch::Tensor p = p0.clone(), m = torch::zeros({n}, torch::kDouble), v = torch::zeros({n}, torch::kDouble);
  for (int s = 1; s <= 6; ++s) {
    const AdamWOptions o = Options(s);
    const torch::Tensor g = grads[s - 1] * o.grad_scale;
    p = p * (1 - o.lr * o.weight_decay);
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    const torch::Tensor m_hat = m / (1 - std::pow(o.beta1, s)), v_hat = v / (1 - std::pow(o.beta2, s));
    p = p - o.lr * m_hat / (v_hat.sqrt() + o.eps);
  }
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    torch::Tensor fp = p0.to(dtype, /*non_blocking=*/false, /*copy=*/true), fm = torch::zeros({n}, dtype),
                  fv = torch::zeros({n}, dtype);
    for (int s = 1; s <= 6; ++s) ops::adamw_step(fp, grads[s - 1].to(dtype), fm, fv, Options(s));
    const double rtol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    EXPECT_TRUE(torch::allclose(fp.to(torch::kDouble), p, rtol, rtol))
        << "dtype " << dtype << " max error " << (fp.to(torch::kDouble) - p).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(fm.to(torch::kDouble), m, rtol, rtol));
  }
}

TEST(AdamWCpu, RejectsBadBuffers) {
  torch::Tensor p = torch::zeros({10}), m = torch::zeros({10}), v = torch::zeros({10});
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({9}), m, v, Options(1)), c10::Error);
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({10}, torch::kLong), m, v, Options(1)), c10::Error);
  torch::Tensor m_half = torch::zeros({10}, torch::kHalf);
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({10}), m_half, v, Options(1)), c10::Error);
  torch::Tensor strided = torch::zeros({20}).slice(0, 0, 20, 2);
  EXPECT_THROW(ops::adamw_step(strided, torch::zeros({10}), m, v, Options(1)), c10::Error);
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({10}), m, v, Options(0)), c10::Error);
}

// The optional squared-gradient partials: they sum to the raw gradient's squared norm (grad_scale not
// applied), every entry is written whatever the buffer held, and the update is the same as without them.
TEST(AdamWCpu, GradSquarePartialsSumToTheGradientsSquaredNorm) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    AdamWBuffers with = MakeAdamWBuffers(5003, dtype, torch::kFloat, 9);
    AdamWBuffers without = Clone(with);
    const torch::Tensor grad = (torch::randn({5003}, torch::kDouble) * 0.3).to(dtype);
    torch::Tensor partials = torch::full({ops::kAdamWGradSquarePartials}, std::nan(""), torch::kDouble);
    ops::adamw_step(with.param, grad, with.exp_avg, with.exp_avg_sq, Options(1), {}, partials);
    ops::adamw_step(without.param, grad, without.exp_avg, without.exp_avg_sq, Options(1));
    EXPECT_TRUE(torch::equal(with.param, without.param));
    EXPECT_TRUE(torch::equal(with.exp_avg_sq, without.exp_avg_sq));
    ASSERT_TRUE(torch::isfinite(partials).all().item<bool>()) << "an entry was left as it was";
    const double expected = grad.to(torch::kDouble).pow(2).sum().item<double>();
    EXPECT_NEAR(partials.sum().item<double>(), expected, 1e-12 * expected);
  }
  // An empty parameter still writes its (zero) partials.
  torch::Tensor empty = torch::zeros({0}), partials = torch::ones({ops::kAdamWGradSquarePartials}, torch::kDouble);
  torch::Tensor m = torch::zeros({0}), v = torch::zeros({0});
  ops::adamw_step(empty, torch::zeros({0}), m, v, Options(1), {}, partials);
  EXPECT_EQ(partials.abs().sum().item<double>(), 0.0);
  // Wrong length or dtype: refused.
  torch::Tensor p = torch::zeros({10}), m10 = torch::zeros({10}), v10 = torch::zeros({10});
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({10}), m10, v10, Options(1), {}, torch::zeros({16}, torch::kDouble)),
               c10::Error);
  EXPECT_THROW(ops::adamw_step(p, torch::zeros({10}), m10, v10, Options(1), {},
                               torch::zeros({ops::kAdamWGradSquarePartials}, torch::kFloat)),
               c10::Error);
}

// torch.ops.tigon.adamw_step as Python sees it: in place on its mutable arguments.
TEST(AdamWCpu, RegisteredTorchOp) {
  auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("tigon::adamw_step", "")
          .typed<void(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, double,
                      double, double, double, double, int64_t, double, const c10::optional<torch::Tensor>&,
                      const c10::optional<torch::Tensor>&)>();
  AdamWBuffers fused = MakeAdamWBuffers(100, torch::kFloat, torch::kFloat, 8);
  fused.param_copy = torch::zeros({100}, torch::kHalf);
  AdamWBuffers ref = Clone(fused);
  const torch::Tensor grad = torch::randn({100});
  const AdamWOptions o = Options(1);
  op.call(fused.param, grad, fused.exp_avg, fused.exp_avg_sq, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.step,
          o.grad_scale, fused.param_copy, c10::nullopt);
  reference::adamw_step(ref.param, grad, ref.exp_avg, ref.exp_avg_sq, o, ref.param_copy);
  ExpectMatchesReference(fused.param, ref.param, "param");
  ExpectMatchesReference(fused.param_copy, ref.param_copy, "param_copy");
  EXPECT_FALSE(torch::equal(fused.param_copy, torch::zeros({100}, torch::kHalf)));
}

}  // namespace
}  // namespace tigon
