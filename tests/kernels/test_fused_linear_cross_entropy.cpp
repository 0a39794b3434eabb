// Fused linear + cross entropy (CPU path: chunked, logits never whole) against the reference
// composition (hidden @ W^T + b, then the reference cross entropy) and its autograd, in float64.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/ops/fused_linear_cross_entropy.h"
#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace tigon {
namespace {

struct FlceInputs {
  torch::Tensor hidden, weight, bias, target, weights;
};

FlceInputs MakeFlceInputs(int64_t n, int64_t h, int64_t vocab, uint64_t seed, double ignored_fraction = 0.2) {
  torch::manual_seed(seed);
  FlceInputs in;
  in.hidden = torch::randn({n, h}, torch::kDouble);
  in.weight = torch::randn({vocab, h}, torch::kDouble) * (2.0 / std::sqrt(static_cast<double>(h)));
  in.bias = torch::randn({vocab}, torch::kDouble) * 0.5;
  in.target = torch::randint(0, vocab, {n}, torch::kLong);
  in.target.masked_fill_(torch::rand({n}, torch::kDouble) < ignored_fraction, -100);
  in.weights = torch::rand({n}, torch::kDouble) + 0.5;
  return in;
}

struct FlceResult {
  torch::Tensor loss, grad_hidden, grad_weight, grad_bias;
};

// chunk_size < 0: the reference composition; otherwise the fused op with that chunk size (0 = default).
FlceResult RunFlce(const FlceInputs& in, const CrossEntropyOptions& o, bool use_bias, bool use_weights,
                   int64_t chunk_size, const torch::Tensor& upstream, bool weight_requires_grad = true) {
  torch::Tensor hidden = in.hidden.clone().requires_grad_(true);
  torch::Tensor weight = in.weight.clone().requires_grad_(weight_requires_grad);
  torch::Tensor bias = use_bias ? in.bias.clone().requires_grad_(true) : torch::Tensor();
  const torch::Tensor tw = use_weights ? in.weights : torch::Tensor();
  torch::Tensor loss =
      chunk_size < 0 ? reference::fused_linear_cross_entropy(hidden, weight, bias, in.target, o, tw)
                     : ops::fused_linear_cross_entropy_chunked(hidden, weight, bias, in.target, o, tw, chunk_size);
  loss.backward(upstream.to(loss.scalar_type()));
  return {loss.detach(), hidden.grad(), weight.grad(), use_bias ? bias.grad() : torch::Tensor()};
}

void ExpectNear(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what;
  if (!expected.defined()) return;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const torch::Tensor a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  EXPECT_TRUE(torch::allclose(a, e, rtol, atol)) << what << ": max abs error " << (a - e).abs().max().item<double>();
}

void ExpectSameResult(const FlceResult& r, const FlceResult& ref, double rtol, double atol, const std::string& what) {
  ExpectNear(r.loss, ref.loss, rtol, atol, "loss " + what);
  ExpectNear(r.grad_hidden, ref.grad_hidden, rtol, atol, "grad_hidden " + what);
  ExpectNear(r.grad_weight, ref.grad_weight, rtol, atol, "grad_weight " + what);
  ExpectNear(r.grad_bias, ref.grad_bias, rtol, atol, "grad_bias " + what);
}

torch::Tensor Upstream(const CrossEntropyOptions& o, int64_t n) {
  return o.reduction == Reduction::kNone ? torch::randn({n}, torch::kDouble) : torch::ones({}, torch::kDouble);
}

// Every option and chunk sizes that divide N, do not divide it, are 1, and exceed N; float64 throughout,
// so the chunked sums differ from the reference only by rounding order (1e-10).
TEST(FusedLinearCrossEntropyCpu, EveryOptionAndChunkSizeMatchesReference) {
  const FlceInputs in = MakeFlceInputs(37, 24, 1000, 1);
  int checked = 0;
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (int variant = 0; variant < 4; ++variant) {
      CrossEntropyOptions o;
      o.reduction = reduction;
      o.label_smoothing = variant == 1 || variant == 3 ? 0.1 : 0.0;
      o.z_loss_scale = variant >= 2 ? 1e-3 : 0.0;
      o.softcap = variant == 3 ? 5.0 : 0.0;
      const bool use_bias = variant % 2 == 1, use_weights = variant >= 2;
      torch::manual_seed(100 + variant);
      const torch::Tensor upstream = Upstream(o, 37);
      const FlceResult ref = RunFlce(in, o, use_bias, use_weights, -1, upstream);
      for (int64_t chunk : {1, 8, 13, 37, 64, 0}) {
        const FlceResult r = RunFlce(in, o, use_bias, use_weights, chunk, upstream);
        ExpectSameResult(r, ref, 1e-10, 1e-12,
                         "reduction " + std::to_string(static_cast<int>(reduction)) + " variant " +
                             std::to_string(variant) + " chunk " + std::to_string(chunk));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 72);
}

// The 1/n_valid of "mean" counts the whole batch: with a chunk that holds only ignored rows, and with
// every row ignored.
TEST(FusedLinearCrossEntropyCpu, MeanCountsValidTargetsOfTheWholeBatch) {
  FlceInputs in = MakeFlceInputs(12, 8, 50, 2, 0.0);
  in.target.narrow(0, 0, 4).fill_(-100);  // the first chunk of 4 is fully ignored
  const CrossEntropyOptions o;
  const torch::Tensor one = torch::ones({}, torch::kDouble);
  ExpectSameResult(RunFlce(in, o, true, false, 4, one), RunFlce(in, o, true, false, -1, one), 1e-10, 1e-12,
                   "partly ignored");
  in.target.fill_(-100);
  const FlceResult all_ignored = RunFlce(in, o, true, true, 5, one);
  EXPECT_EQ(all_ignored.loss.item<double>(), 0.0);
  EXPECT_EQ(all_ignored.grad_weight.abs().max().item<double>(), 0.0);
  EXPECT_EQ(all_ignored.grad_hidden.abs().max().item<double>(), 0.0);
}

TEST(FusedLinearCrossEntropyCpu, ScalarUpstreamOtherThanOne) {
  const FlceInputs in = MakeFlceInputs(20, 16, 300, 3);
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    CrossEntropyOptions o;
    o.reduction = reduction;
    const torch::Tensor upstream = torch::full({}, 0.37, torch::kDouble);
    ExpectSameResult(RunFlce(in, o, true, true, 6, upstream), RunFlce(in, o, true, true, -1, upstream), 1e-10, 1e-12,
                     "scaled upstream");
  }
}

// A frozen lm_head (LoRA fine-tuning): only grad_hidden is produced.
TEST(FusedLinearCrossEntropyCpu, FrozenWeightGetsNoGradient) {
  const FlceInputs in = MakeFlceInputs(10, 8, 64, 4);
  const CrossEntropyOptions o;
  const torch::Tensor one = torch::ones({}, torch::kDouble);
  const FlceResult r = RunFlce(in, o, false, false, 3, one, /*weight_requires_grad=*/false);
  const FlceResult ref = RunFlce(in, o, false, false, -1, one, false);
  EXPECT_FALSE(r.grad_weight.defined());
  ExpectNear(r.grad_hidden, ref.grad_hidden, 1e-10, 1e-12, "grad_hidden");
  ExpectNear(r.loss, ref.loss, 1e-10, 1e-12, "loss");
}

TEST(FusedLinearCrossEntropyCpu, NonContiguousInputs) {
  const FlceInputs in = MakeFlceInputs(15, 12, 101, 5);
  const CrossEntropyOptions o;
  const torch::Tensor one = torch::ones({}, torch::kDouble);
  const FlceResult ref = RunFlce(in, o, true, false, -1, one);
  // hidden stored column-major, weight stored as [H, V] and transposed, bias a strided slice.
  torch::Tensor hidden = in.hidden.t().contiguous().t().requires_grad_(true);
  torch::Tensor weight = in.weight.t().contiguous().t().requires_grad_(true);
  torch::Tensor bias_storage = torch::zeros({2 * 101}, torch::kDouble);
  bias_storage.slice(0, 0, 202, 2).copy_(in.bias);
  torch::Tensor bias = bias_storage.slice(0, 0, 202, 2).detach().requires_grad_(true);
  ASSERT_FALSE(hidden.is_contiguous() || weight.is_contiguous() || bias.is_contiguous());
  torch::Tensor loss = ops::fused_linear_cross_entropy_chunked(hidden, weight, bias, in.target, o, {}, 4);
  loss.backward();
  ExpectSameResult({loss.detach(), hidden.grad(), weight.grad(), bias.grad()}, ref, 1e-10, 1e-12, "non-contiguous");
}

// bf16 hidden and weight: each chunk's logits are a bf16 matmul (as in the reference), the CE math is
// fp32, and grad_W accumulates in bf16 over the chunks (one rounding per chunk, like Liger). Oracle: the
// reference on the same bf16 values in float64. Loss within 2e-2 relative: the bf16 logits themselves
// carry 2^-9 relative error, magnified by lse. Gradients within 3e-2 relative of their largest entry.
TEST(FusedLinearCrossEntropyCpu, BFloat16WithinStatedTolerance) {
  const FlceInputs in64 = MakeFlceInputs(32, 64, 500, 6);
  FlceInputs in = in64;
  in.hidden = in64.hidden.to(torch::kBFloat16);
  in.weight = in64.weight.to(torch::kBFloat16);
  in.bias = in64.bias.to(torch::kBFloat16);
  FlceInputs as64 = in;
  as64.hidden = in.hidden.to(torch::kDouble);
  as64.weight = in.weight.to(torch::kDouble);
  as64.bias = in.bias.to(torch::kDouble);
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  const torch::Tensor one = torch::ones({}, torch::kDouble);
  const FlceResult r = RunFlce(in, o, true, true, 8, one);
  const FlceResult ref = RunFlce(as64, o, true, true, -1, one);
  EXPECT_EQ(r.loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(r.grad_weight.scalar_type(), torch::kBFloat16);
  ExpectNear(r.loss, ref.loss, 2e-2, 0, "bf16 loss");
  for (const auto& [a, e, name] : {std::tuple{r.grad_hidden, ref.grad_hidden, "grad_hidden"},
                                   std::tuple{r.grad_weight, ref.grad_weight, "grad_weight"},
                                   std::tuple{r.grad_bias, ref.grad_bias, "grad_bias"}}) {
    const double scale = e.abs().max().item<double>();
    ExpectNear(a, e, 3e-2, 3e-2 * scale, std::string("bf16 ") + name);
  }
}

TEST(FusedLinearCrossEntropyCpu, DefaultChunkStaysWithinTheMemoryBudget) {
  // Llama-3 head: 8 equal chunks of 1024 rows, 1024 x 128256 x 2 bytes = 250.5 MiB; at 32,768 tokens,
  // 32 chunks of 1024 rows.
  EXPECT_EQ(ops::DefaultFusedLinearCrossEntropyChunk(8192, 128256, 4096, 2), 1024);
  EXPECT_EQ(ops::DefaultFusedLinearCrossEntropyChunk(32768, 128256, 4096, 2), 1024);
  for (int64_t n : {1, 7, 100, 4096, 8192, 16384, 100000}) {
    for (int64_t vocab : {1000, 32000, 128256, 256000}) {
      const int64_t chunk = ops::DefaultFusedLinearCrossEntropyChunk(n, vocab, 4096, 2);
      EXPECT_GE(chunk, 1);
      EXPECT_LE(chunk, n);  // never above N
      EXPECT_LE(chunk * vocab * 2, 256LL << 20) << "n " << n << " vocab " << vocab;
    }
  }
}

TEST(FusedLinearCrossEntropyCpu, EmptyBatch) {
  torch::Tensor hidden = torch::randn({0, 8}, torch::kDouble).requires_grad_(true);
  torch::Tensor weight = torch::randn({20, 8}, torch::kDouble).requires_grad_(true);
  torch::Tensor loss = ops::fused_linear_cross_entropy(hidden, weight, {}, torch::zeros({0}, torch::kLong), {});
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(weight.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(hidden.grad().sizes(), hidden.sizes());
}

TEST(FusedLinearCrossEntropyCpu, RejectsBadInput) {
  const FlceInputs in = MakeFlceInputs(6, 8, 20, 7);
  const CrossEntropyOptions o;
  EXPECT_THROW(ops::fused_linear_cross_entropy(in.hidden, in.weight.narrow(1, 0, 7), {}, in.target, o), c10::Error);
  EXPECT_THROW(ops::fused_linear_cross_entropy(in.hidden, in.weight.to(torch::kFloat), {}, in.target, o), c10::Error);
  EXPECT_THROW(ops::fused_linear_cross_entropy(in.hidden, in.weight, in.bias.narrow(0, 0, 5), in.target, o),
               c10::Error);
  EXPECT_THROW(ops::fused_linear_cross_entropy(in.hidden, in.weight, {}, in.target.narrow(0, 0, 5), o), c10::Error);
}

// torch.ops.tigon.fused_linear_cross_entropy as Python sees it, with its chunk_size argument.
TEST(FusedLinearCrossEntropyCpu, RegisteredTorchOp) {
  const FlceInputs in = MakeFlceInputs(9, 8, 40, 8);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::fused_linear_cross_entropy", "")
                .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const c10::optional<torch::Tensor>&,
                                     const torch::Tensor&, const c10::optional<torch::Tensor>&, int64_t,
                                     c10::string_view, double, double, double, int64_t)>();
  CrossEntropyOptions o;
  o.reduction = Reduction::kNone;
  o.z_loss_scale = 1e-3;
  torch::manual_seed(9);
  const torch::Tensor upstream = torch::randn({9}, torch::kDouble);
  const FlceResult ref = RunFlce(in, o, true, true, -1, upstream);
  torch::Tensor hidden = in.hidden.clone().requires_grad_(true);
  torch::Tensor weight = in.weight.clone().requires_grad_(true);
  torch::Tensor bias = in.bias.clone().requires_grad_(true);
  torch::Tensor loss = op.call(hidden, weight, bias, in.target, in.weights, -100, "none", 0.0, 1e-3, 0.0, 2);
  loss.backward(upstream);
  ExpectSameResult({loss.detach(), hidden.grad(), weight.grad(), bias.grad()}, ref, 1e-10, 1e-12, "torch op");
}

// consuming_hidden: the same loss and gradients bit for bit; for "sum"/"mean" a contiguous hidden's buffer
// ends up holding grad_hidden, while "none" (which recomputes from hidden in backward) and a strided
// hidden keep theirs.
TEST(FusedLinearCrossEntropyCpu, ConsumingHiddenGivesTheSameResultsAndTakesHiddensBuffer) {
  const FlceInputs in = MakeFlceInputs(37, 12, 101, 8);
  for (const auto reduction : {Reduction::kSum, Reduction::kMean, Reduction::kNone}) {
    for (const bool contiguous : {true, false}) {
      for (const bool use_bias : {false, true}) {
        CrossEntropyOptions o;
        o.reduction = reduction;
        const torch::Tensor upstream = Upstream(o, 37);
        auto run = [&](bool consuming, torch::Tensor* hidden_after) {
          torch::Tensor leaf = in.hidden.clone().requires_grad_(true);
          torch::Tensor weight = in.weight.clone().requires_grad_(true);
          torch::Tensor bias = use_bias ? in.bias.clone().requires_grad_(true) : torch::Tensor();
          // A product of the graph, as in the model (the final norm's output), stored either way.
          torch::Tensor hidden = contiguous ? leaf * 1.0 : (leaf.t().contiguous() * 1.0).t();
          EXPECT_EQ(hidden.is_contiguous(), contiguous);
          torch::Tensor loss =
              consuming ? ops::fused_linear_cross_entropy_consuming_hidden(hidden, weight, bias, in.target, o,
                                                                           in.weights)
                        : ops::fused_linear_cross_entropy(hidden, weight, bias, in.target, o, in.weights);
          loss.backward(upstream);
          *hidden_after = hidden.detach().clone();
          return FlceResult{loss.detach(), leaf.grad(), weight.grad(), use_bias ? bias.grad() : torch::Tensor()};
        };
        torch::Tensor plain_after, consuming_after;
        const FlceResult plain = run(false, &plain_after);
        const FlceResult consuming = run(true, &consuming_after);
        const std::string where = std::string(reduction == Reduction::kNone ? "none" : "sum/mean") +
                                  (contiguous ? " contiguous" : " strided") + (use_bias ? " bias" : "");
        EXPECT_TRUE(torch::equal(plain.loss, consuming.loss)) << where;
        EXPECT_TRUE(torch::equal(plain.grad_hidden, consuming.grad_hidden)) << where;
        EXPECT_TRUE(torch::equal(plain.grad_weight, consuming.grad_weight)) << where;
        if (use_bias) EXPECT_TRUE(torch::equal(plain.grad_bias, consuming.grad_bias)) << where;
        EXPECT_TRUE(torch::equal(plain_after, in.hidden)) << where;
        if (contiguous && reduction != Reduction::kNone) {
          EXPECT_TRUE(torch::equal(consuming_after, consuming.grad_hidden)) << where << ": hidden should hold its gradient";
        } else {
          EXPECT_TRUE(torch::equal(consuming_after, in.hidden)) << where;
        }
      }
    }
  }
}

TEST(FusedLinearCrossEntropyCpu, ConsumingHiddenSavedByAnotherNodeFailsInsteadOfReadingGradients) {
  const FlceInputs in = MakeFlceInputs(9, 6, 31, 9);
  torch::Tensor leaf = in.hidden.clone().requires_grad_(true);
  torch::Tensor weight = in.weight.clone().requires_grad_(true);
  torch::Tensor hidden = leaf.exp();  // exp's backward reads its own output
  torch::Tensor loss =
      ops::fused_linear_cross_entropy_consuming_hidden(hidden, weight, {}, in.target, CrossEntropyOptions(), {});
  EXPECT_THROW(loss.backward(), c10::Error);
}

}  // namespace
}  // namespace tigon

namespace tigon {
namespace {

// Weights from the tokens' own losses, chunk by chunk: the sum and gradients equal the reference cross
// entropy with those weights (computed here from the float64 log-probabilities), whatever the chunking; the
// chunks arrive in order, cover every token once, and hold whole multiples of chunk_multiple.
TEST(FusedLinearCrossEntropyCpu, WeightsFromTheTokensOwnLossesChunkByChunk) {
  torch::manual_seed(21);
  const int64_t n = 36, h = 8, v = 23;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor hidden0 = torch::randn({n, h}, f64), weight0 = torch::randn({v, h}, f64) * 0.5;
  torch::Tensor target = torch::randint(0, v, {n}, torch::kLong);
  target.index_put_({torch::arange(0, n, 5)}, -100);
  const torch::Tensor advantages = torch::randn({n}, f64);
  // An importance-sampling-like coefficient: -exp(lp) * A, nonlinear in lp and of both signs.
  auto weight_of_losses = [&](const torch::Tensor& losses, int64_t start, int64_t rows) {
    return torch::exp(-losses) * advantages.narrow(0, start, rows);
  };
  for (int64_t chunk : {0, 4, 12, 36}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    std::vector<std::pair<int64_t, int64_t>> seen;
    torch::Tensor hidden = hidden0.clone().requires_grad_(true), weight = weight0.clone().requires_grad_(true);
    const torch::Tensor loss = ops::fused_linear_cross_entropy_weighted_by(
        hidden, weight, target,
        [&](const torch::Tensor& losses, int64_t start, int64_t rows) {
          seen.emplace_back(start, rows);
          return weight_of_losses(losses, start, rows);
        },
        /*chunk_multiple=*/4, chunk);
    loss.backward();
    int64_t next = 0;
    for (const auto& [start, rows] : seen) {
      EXPECT_EQ(start, next);
      EXPECT_EQ(rows % 4, 0);
      next = start + rows;
    }
    EXPECT_EQ(next, n);
    if (chunk == 4) EXPECT_EQ(seen.size(), 9u);
    // The reference: the weights from the float64 losses, held constant.
    torch::Tensor h2 = hidden0.clone().requires_grad_(true), w2 = weight0.clone().requires_grad_(true);
    const torch::Tensor logits = h2.matmul(w2.t());
    const torch::Tensor lp = torch::log_softmax(logits, -1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
    const torch::Tensor valid = target.ne(-100).to(torch::kFloat64);
    const torch::Tensor w = weight_of_losses((-lp * valid).detach(), 0, n);
    const torch::Tensor expected = -(w * lp * valid).sum();
    expected.backward();
    EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-9);
    EXPECT_TRUE(torch::allclose(hidden.grad(), h2.grad(), 1e-9, 1e-11));
    EXPECT_TRUE(torch::allclose(weight.grad(), w2.grad(), 1e-9, 1e-11));
  }
}

}  // namespace
}  // namespace tigon
