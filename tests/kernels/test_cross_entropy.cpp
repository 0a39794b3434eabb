// Fused cross entropy (CPU path) against the Hugging Face composition in kernels/reference and its
// autograd, in float64 unless a test says otherwise. The fused op overwrites its input with the gradient,
// so every check hands it a clone.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace tigon {
namespace {

// Random logits with a spread like a trained head's (std 3), and targets with ~20% ignored.
struct CeInputs {
  torch::Tensor logits, target, weights;
};

CeInputs MakeCeInputs(int64_t n, int64_t vocab, uint64_t seed, double ignored_fraction = 0.2,
                      torch::ScalarType dtype = torch::kDouble) {
  torch::manual_seed(seed);
  CeInputs in;
  in.logits = (torch::randn({n, vocab}, torch::kDouble) * 3).to(dtype);
  in.target = torch::randint(0, vocab, {n}, torch::kLong);
  const torch::Tensor ignored = torch::rand({n}, torch::kDouble) < ignored_fraction;
  in.target.masked_fill_(ignored, -100);
  in.weights = torch::rand({n}, torch::kDouble) + 0.5;
  return in;
}

std::string Describe(const CrossEntropyOptions& o) {
  const char* red = o.reduction == Reduction::kMean ? "mean" : o.reduction == Reduction::kSum ? "sum" : "none";
  return std::string("reduction=") + red + " ls=" + std::to_string(o.label_smoothing) +
         " z=" + std::to_string(o.z_loss_scale) + " softcap=" + std::to_string(o.softcap);
}

// Loss and d loss / d logits of the reference composition (autograd) and of the fused op, for the same
// upstream gradient (a random [N] vector for reduction "none", `scalar_upstream` otherwise).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> RunBoth(const torch::Tensor& logits,
                                                                               const torch::Tensor& target,
                                                                               const CrossEntropyOptions& options,
                                                                               const torch::Tensor& weights,
                                                                               double scalar_upstream = 1.0) {
  torch::Tensor upstream = options.reduction == Reduction::kNone ? torch::randn({logits.size(0)}, torch::kDouble)
                                                                 : torch::full({}, scalar_upstream, torch::kDouble);
  torch::Tensor x_ref = logits.detach().clone().requires_grad_(true);
  torch::Tensor loss_ref = reference::cross_entropy(x_ref, target, options, weights);
  loss_ref.backward(upstream.to(loss_ref.scalar_type()));
  torch::Tensor x = logits.detach().clone().requires_grad_(true);
  torch::Tensor loss = ops::cross_entropy(x, target, options, weights);
  loss.backward(upstream.to(loss.scalar_type()));
  return {loss.detach(), loss_ref.detach(), x.grad(), x_ref.grad()};
}

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                 const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const torch::Tensor a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  const double max_err = (a - e).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(a, e, rtol, atol)) << what << ": max abs error " << max_err;
}

// Every option, alone and combined, on an odd vocabulary. float64 on both sides: the only difference is
// the summation order of the online softmax, so 1e-10 is generous.
TEST(CrossEntropyCpu, EveryOptionMatchesReferenceInFloat64) {
  const CeInputs in = MakeCeInputs(37, 1000, 1);
  int checked = 0;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (double ls : {0.0, 0.1}) {
      for (double z : {0.0, 1e-3}) {
        for (double cap : {0.0, 7.5}) {
          for (bool use_weights : {false, true}) {
            CrossEntropyOptions o;
            o.reduction = reduction;
            o.label_smoothing = ls;
            o.z_loss_scale = z;
            o.softcap = cap;
            const auto [loss, loss_ref, grad, grad_ref] =
                RunBoth(in.logits, in.target, o, use_weights ? in.weights : torch::Tensor());
            const std::string what = Describe(o) + (use_weights ? " weighted" : "");
            ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss " + what);
            ExpectClose(grad, grad_ref, 1e-10, 1e-13, "grad " + what);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 48);
}

TEST(CrossEntropyCpu, LargeVocabularySmallBatch) {
  const CeInputs in = MakeCeInputs(5, 32000, 2, 0.3);
  CrossEntropyOptions o;
  o.label_smoothing = 0.05;
  o.z_loss_scale = 1e-4;
  const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, o, torch::Tensor());
  ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss");
  ExpectClose(grad, grad_ref, 1e-10, 1e-14, "grad");
}

TEST(CrossEntropyCpu, OneRowAndOddVocabulary) {
  for (int64_t vocab : {1, 2, 3, 31, 257}) {
    const CeInputs in = MakeCeInputs(1, vocab, 3, 0.0);
    for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      CrossEntropyOptions o;
      o.reduction = reduction;
      o.label_smoothing = 0.2;
      const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, o, torch::Tensor());
      ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss V=" + std::to_string(vocab));
      ExpectClose(grad, grad_ref, 1e-10, 1e-13, "grad V=" + std::to_string(vocab));
    }
  }
}

// A fully masked micro-batch: loss 0 (not 0/0) and a zero gradient, for every reduction.
TEST(CrossEntropyCpu, AllIgnoredRowsGiveZeroLossAndGradient) {
  CeInputs in = MakeCeInputs(6, 100, 4);
  in.target.fill_(-100);
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CrossEntropyOptions o;
    o.reduction = reduction;
    o.label_smoothing = 0.1;
    o.z_loss_scale = 1e-3;
    const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, o, in.weights);
    EXPECT_EQ(loss.abs().max().item<double>(), 0.0);
    ExpectClose(loss, loss_ref, 0, 0, "loss");
    EXPECT_EQ(grad.abs().max().item<double>(), 0.0);
    ExpectClose(grad, grad_ref, 0, 0, "grad");
  }
}

TEST(CrossEntropyCpu, CustomIgnoreIndex) {
  CeInputs in = MakeCeInputs(20, 50, 5, 0.0);
  in.target.index_put_({torch::arange(0, 20, 3)}, 7);
  CrossEntropyOptions o;
  o.ignore_index = 7;
  const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, o, torch::Tensor());
  ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss");
  ExpectClose(grad, grad_ref, 1e-10, 1e-13, "grad");
  EXPECT_EQ(grad.index({torch::arange(0, 20, 3)}).abs().max().item<double>(), 0.0);
}

// The backward scales the in-place gradient by grad_output; 1 is skipped, anything else must apply.
TEST(CrossEntropyCpu, ScalarUpstreamGradientOtherThanOne) {
  const CeInputs in = MakeCeInputs(9, 300, 6);
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    CrossEntropyOptions o;
    o.reduction = reduction;
    const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, o, in.weights, -2.75);
    ExpectClose(grad, grad_ref, 1e-10, 1e-13, "grad");
  }
}

// A row-strided view (a slice of a wider buffer) is used in place: its gradient is right and the columns
// outside the view are not touched. A view with a strided vocabulary dimension goes through a copy.
TEST(CrossEntropyCpu, NonContiguousLogits) {
  const CeInputs in = MakeCeInputs(11, 203, 7);
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  torch::Tensor x_ref = in.logits.clone().requires_grad_(true);
  torch::Tensor loss_ref = reference::cross_entropy(x_ref, in.target, o);
  loss_ref.backward();

  torch::Tensor wide = torch::randn({11, 210}, torch::kDouble);
  wide.narrow(1, 0, 203).copy_(in.logits);
  const torch::Tensor padding_before = wide.narrow(1, 203, 7).clone();
  torch::Tensor row_strided = wide.narrow(1, 0, 203).detach().requires_grad_(true);
  ASSERT_FALSE(row_strided.is_contiguous());
  torch::Tensor loss = ops::cross_entropy(row_strided, in.target, o);
  loss.backward();
  ExpectClose(loss, loss_ref, 1e-10, 1e-12, "row-strided loss");
  ExpectClose(row_strided.grad(), x_ref.grad(), 1e-10, 1e-13, "row-strided grad");
  EXPECT_TRUE(torch::equal(wide.narrow(1, 203, 7), padding_before)) << "wrote outside the view";

  torch::Tensor transposed_storage = in.logits.t().contiguous().t().detach().requires_grad_(true);
  ASSERT_EQ(transposed_storage.stride(1), 11);
  torch::Tensor loss2 = ops::cross_entropy(transposed_storage, in.target, o);
  loss2.backward();
  ExpectClose(loss2, loss_ref, 1e-10, 1e-12, "column-major loss");
  ExpectClose(transposed_storage.grad(), x_ref.grad(), 1e-10, 1e-13, "column-major grad");
}

// bf16 logits, fp32 accumulation, gradient rounded to bf16. Oracle: the reference on the same values in
// float64. Loss: fp32 sums over V terms, 1e-5 relative. Gradient: one bf16 rounding (2^-9 relative) on
// top of fp32 error, so 8e-3 relative plus an absolute floor for values that round to tiny numbers.
TEST(CrossEntropyCpu, BFloat16WithinStatedTolerance) {
  const CeInputs in = MakeCeInputs(16, 4099, 8, 0.2, torch::kBFloat16);
  for (Reduction reduction : {Reduction::kMean, Reduction::kNone}) {
    CrossEntropyOptions o;
    o.reduction = reduction;
    o.label_smoothing = 0.1;
    o.z_loss_scale = 1e-4;
    o.softcap = 30.0;
    torch::manual_seed(80);
    torch::Tensor x_ref = in.logits.to(torch::kDouble).requires_grad_(true);
    torch::Tensor loss_ref = reference::cross_entropy(x_ref, in.target, o, in.weights);
    torch::Tensor x = in.logits.clone().requires_grad_(true);
    torch::Tensor loss = ops::cross_entropy(x, in.target, o, in.weights);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    const torch::Tensor upstream =
        reduction == Reduction::kNone ? torch::rand({16}, torch::kDouble) + 0.5 : torch::ones({}, torch::kDouble);
    loss_ref.backward(upstream);
    loss.backward(upstream.to(torch::kFloat));
    EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
    ExpectClose(loss, loss_ref, 1e-5, 1e-6, "bf16 loss");
    const double scale = x_ref.grad().abs().max().item<double>();
    ExpectClose(x.grad(), x_ref.grad(), 8e-3, 1e-3 * scale, "bf16 grad");
  }
}

// Vocabulary entries masked with -inf (padding) get probability 0 and a zero gradient, not NaN.
TEST(CrossEntropyCpu, NegativeInfinityLogitsAreMaskedEntries) {
  CeInputs in = MakeCeInputs(4, 64, 9, 0.0);
  in.logits.narrow(1, 50, 14).fill_(-std::numeric_limits<double>::infinity());
  in.target.clamp_max_(49);
  const auto [loss, loss_ref, grad, grad_ref] = RunBoth(in.logits, in.target, CrossEntropyOptions{}, torch::Tensor());
  ASSERT_TRUE(torch::isfinite(loss).all().item<bool>());
  ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss");
  ExpectClose(grad, grad_ref, 1e-10, 1e-13, "grad");
  EXPECT_EQ(grad.narrow(1, 50, 14).abs().max().item<double>(), 0.0);
}

// The gradient is the logits buffer itself: .grad of a contiguous leaf shares its storage (no [N, V]
// copy anywhere), which is what keeps the extra memory of forward + backward near zero.
TEST(CrossEntropyCpu, GradientLivesInTheLogitsBuffer) {
  const CeInputs in = MakeCeInputs(8, 100, 14);
  torch::Tensor x = in.logits.clone().requires_grad_(true);
  ops::cross_entropy(x, in.target, CrossEntropyOptions{}).backward();
  EXPECT_EQ(x.grad().data_ptr(), x.data_ptr());
}

// Without a gradient to compute, the op must leave its input alone.
TEST(CrossEntropyCpu, NoGradLeavesLogitsUntouched) {
  const CeInputs in = MakeCeInputs(8, 100, 10);
  const torch::Tensor x = in.logits.clone();
  torch::Tensor loss;
  {
    torch::NoGradGuard no_grad;
    loss = ops::cross_entropy(x, in.target, CrossEntropyOptions{});
  }
  EXPECT_TRUE(torch::equal(x, in.logits));
  ExpectClose(loss, reference::cross_entropy(in.logits, in.target, CrossEntropyOptions{}), 1e-10, 1e-12, "loss");
}

// The in-place gradient bumps the logits' version: a graph that saved them fails instead of silently
// reading a gradient.
TEST(CrossEntropyCpu, OverwrittenLogitsSavedElsewhereFailLoudly) {
  const CeInputs in = MakeCeInputs(4, 32, 11, 0.0);
  torch::Tensor leaf = in.logits.clone().requires_grad_(true);
  torch::Tensor logits = leaf * 1.0;
  torch::Tensor saved_user = logits.sin();  // sin saves its input
  torch::Tensor loss = ops::cross_entropy(logits, in.target, CrossEntropyOptions{});
  EXPECT_THROW((loss + saved_user.sum()).backward(), c10::Error);
}

// An empty micro-batch: loss 0 for mean/sum, an empty vector for none, and a backward that runs.
TEST(CrossEntropyCpu, EmptyBatch) {
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CrossEntropyOptions o;
    o.reduction = reduction;
    torch::Tensor x = torch::randn({0, 50}, torch::kDouble).requires_grad_(true);
    torch::Tensor loss = ops::cross_entropy(x, torch::zeros({0}, torch::kLong), o);
    EXPECT_EQ(loss.numel(), reduction == Reduction::kNone ? 0 : 1);
    if (reduction != Reduction::kNone) EXPECT_EQ(loss.item<double>(), 0.0);
    loss.sum().backward();
    EXPECT_EQ(x.grad().sizes(), x.sizes());
  }
}

TEST(CrossEntropyCpu, RejectsBadInput) {
  const CeInputs in = MakeCeInputs(4, 32, 12, 0.0);
  torch::Tensor bad_target = in.target.clone();
  bad_target[2] = 32;
  EXPECT_THROW(ops::cross_entropy(in.logits.clone(), bad_target, CrossEntropyOptions{}), c10::Error);
  EXPECT_THROW(ops::cross_entropy(in.logits.clone(), in.target.to(torch::kInt), CrossEntropyOptions{}), c10::Error);
  EXPECT_THROW(ops::cross_entropy(in.logits.view({2, 2, 32}), in.target, CrossEntropyOptions{}), c10::Error);
  EXPECT_THROW(ops::cross_entropy(in.logits.clone(), in.target.narrow(0, 0, 3), CrossEntropyOptions{}), c10::Error);
}

// torch.ops.tigon.cross_entropy as Python sees it: schema defaults, string reduction, autograd.
TEST(CrossEntropyCpu, RegisteredTorchOp) {
  const CeInputs in = MakeCeInputs(10, 77, 13);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::cross_entropy", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const c10::optional<torch::Tensor>&,
                                     int64_t, c10::string_view, double, double, double)>();
  CrossEntropyOptions o;
  o.reduction = Reduction::kSum;
  o.label_smoothing = 0.1;
  torch::Tensor x_ref = in.logits.clone().requires_grad_(true);
  torch::Tensor loss_ref = reference::cross_entropy(x_ref, in.target, o, in.weights);
  loss_ref.backward();
  torch::Tensor x = in.logits.clone().requires_grad_(true);
  torch::Tensor loss = op.call(x, in.target, in.weights, -100, "sum", 0.1, 0.0, 0.0);
  loss.backward();
  ExpectClose(loss, loss_ref, 1e-10, 1e-12, "loss");
  ExpectClose(x.grad(), x_ref.grad(), 1e-10, 1e-13, "grad");
  EXPECT_THROW(op.call(in.logits.clone(), in.target, c10::nullopt, -100, "avg", 0.0, 0.0, 0.0), c10::Error);
}

}  // namespace
}  // namespace tigon
