// Engine training behaviour through engine.h: sessions, steps, accumulation, precision policies,
// reproducibility and bad input. CPU only.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace tigon {
namespace {

using testing::RandomBatch;
using testing::Rows;
using testing::TinyConfig;
using testing::TinyOptions;

std::unique_ptr<Session> MakeSession(const SessionOptions& options) {
  std::unique_ptr<Session> session;
  Status status = CreateSession(options, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

TEST(CreateSession, ReportsModelAndOps) {
  auto session = MakeSession(TinyOptions());
  ASSERT_TRUE(session);
  auto info = session->Info();
  EXPECT_EQ(info.model_family, "llama");
  EXPECT_EQ(info.precision, "fp32");
  EXPECT_EQ(info.vocab_size, 256);
  // embed 256*32, lm_head 256*32, per layer q 32*32, k,v 2*(16*32), o 32*32, mlp 3*32*64, 2 norms 2*32;
  // final norm 32.
  const int64_t per_layer = 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 64 + 2 * 32;
  EXPECT_EQ(info.parameter_count, 2 * 256 * 32 + 2 * per_layer + 32);
  bool saw_rms = false, saw_adamw = false;
  for (const auto& op : info.ops) {
    EXPECT_EQ(op.choice, "fused") << op.op;
    saw_rms |= op.op == "rms_norm";
    saw_adamw |= op.op == "adamw";
  }
  EXPECT_TRUE(saw_rms);
  EXPECT_TRUE(saw_adamw);
}

TEST(CreateSession, KernelOverridesAreReported) {
  auto options = TinyOptions();
  options.kernel_overrides["rope"] = "reference";
  auto session = MakeSession(options);
  for (const auto& op : session->Info().ops) EXPECT_EQ(op.choice, op.op == "rope" ? "reference" : "fused") << op.op;
}

TEST(CreateSession, BadOptionsAreRefusedWithAReason) {
  struct Case {
    std::string what;
    SessionOptions options;
    std::string expected;
  };
  std::vector<Case> cases;
  {
    auto o = TinyOptions();
    o.precision = "fp8";
    cases.push_back({"precision", o, "precision"});
  }
  {
    auto o = TinyOptions();
    o.config_json = "{\"model_type\": \"llama\", ";
    cases.push_back({"malformed json", o, "JSON"});
  }
  {
    auto o = TinyOptions();
    o.config_json = TinyConfig("gpt5");
    cases.push_back({"unknown family", o, "gpt5"});
  }
  {
    auto o = TinyOptions();
    o.model_path = "/nonexistent";
    cases.push_back({"both sources", o, "exactly one"});
  }
  {
    auto o = TinyOptions();
    o.kernels = "fastest";
    cases.push_back({"kernel choice", o, "fastest"});
  }
  {
    auto o = TinyOptions();
    o.kernel_overrides["flash_attention_9"] = "fused";
    cases.push_back({"unknown op", o, "flash_attention_9"});
  }
  {
    auto o = TinyOptions();
    o.optimizer.lr = -1;
    cases.push_back({"negative lr", o, "optimizer lr = -1"});
  }
  for (const auto& c : cases) {
    std::unique_ptr<Session> session;
    Status status = CreateSession(c.options, &session);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.what << ": " << status.ToString();
    EXPECT_NE(status.message().find(c.expected), std::string::npos) << c.what << ": " << status.message();
    EXPECT_FALSE(session) << c.what;
  }
  SessionOptions missing = TinyOptions();
  missing.config_json.clear();
  missing.model_path = "/nonexistent/model";
  std::unique_ptr<Session> session;
  EXPECT_EQ(CreateSession(missing, &session).code(), StatusCode::kNotFound);
}

TEST(Training, LossFallsWhenFittingOneBatch) {
  auto session = MakeSession(TinyOptions());
  auto batch = RandomBatch(4, 32, 1);
  StepStats first, last;
  for (int i = 0; i < 30; ++i) {
    StepStats stats;
    Status status = session->TrainStep(batch, {}, &stats);
    ASSERT_TRUE(status.ok()) << status.ToString();
    if (i == 0) first = stats;
    last = stats;
  }
  EXPECT_EQ(first.tokens, 4 * 31);  // default labels: inputs shifted, last position ignored
  EXPECT_NEAR(first.loss, std::log(256.0), 0.3);
  EXPECT_LT(last.loss, first.loss - 1.0);
  EXPECT_EQ(last.step, 30);
  EXPECT_GT(last.grad_norm, 0.0);
  EXPECT_GT(last.tokens_per_second, 0.0);
  EXPECT_EQ(session->Info().step, 30);
}

TEST(Training, EveryPrecisionPolicyTrains) {
  for (const char* precision : {"fp32", "bf16", "bf16_mixed"}) {
    for (const char* kernels : {"fused", "reference"}) {
      auto session = MakeSession(TinyOptions(precision, kernels));
      ASSERT_TRUE(session);
      EXPECT_EQ(session->Info().precision, precision);
      auto batch = RandomBatch(2, 32, 3);
      StepStats first, last;
      for (int i = 0; i < 20; ++i) {
        Status status = session->TrainStep(batch, {}, i == 0 ? &first : &last);
        ASSERT_TRUE(status.ok()) << precision << "/" << kernels << ": " << status.ToString();
      }
      EXPECT_LT(last.loss, first.loss - 0.5) << precision << "/" << kernels;
    }
  }
}

TEST(Training, AccumulatingTwoHalvesEqualsOneFullBatch) {
  auto batch = RandomBatch(4, 24, 5);
  batch.labels.resize(batch.input_ids.size());
  for (size_t i = 0; i < batch.labels.size(); ++i)
    batch.labels[i] = (i % 7 == 0) ? kIgnoreIndex : batch.input_ids[(i + 1) % batch.input_ids.size()];
  // Uneven token counts in the two halves: accumulation must normalise by all tokens, not average means.
  for (int i = 0; i < 20; ++i) batch.labels[i] = kIgnoreIndex;

  auto whole = MakeSession(TinyOptions());
  auto split = MakeSession(TinyOptions());
  StepStats a, b1, b2, b3, a2, b4;
  ASSERT_TRUE(whole->TrainStep(batch, {}, &a).ok());
  ASSERT_TRUE(split->ForwardBackward(Rows(batch, 0, 1), &b1).ok());
  ASSERT_TRUE(split->ForwardBackward(Rows(batch, 1, 3), &b2).ok());
  EXPECT_EQ(b2.accumulated_batches, 2);
  EXPECT_EQ(split->Info().accumulated_batches, 2);
  ASSERT_TRUE(split->OptimStep({}, &b3).ok());
  EXPECT_EQ(b1.tokens + b2.tokens, a.tokens);
  EXPECT_NEAR((b1.loss * b1.tokens + b2.loss * b2.tokens) / a.tokens, a.loss, 1e-5);
  EXPECT_NEAR(b3.grad_norm, a.grad_norm, 1e-5 * a.grad_norm);
  // The next step sees the same weights.
  auto next = RandomBatch(4, 24, 6);
  ASSERT_TRUE(whole->TrainStep(next, {}, &a2).ok());
  ASSERT_TRUE(split->TrainStep(next, {}, &b4).ok());
  EXPECT_NEAR(a2.loss, b4.loss, 1e-5);
}

TEST(Training, SameSeedIsBitReproducible) {
  auto one = MakeSession(TinyOptions("bf16_mixed"));
  auto two = MakeSession(TinyOptions("bf16_mixed"));
  for (int i = 0; i < 5; ++i) {
    auto batch = RandomBatch(2, 16, 100 + i);
    StepStats a, b;
    ASSERT_TRUE(one->TrainStep(batch, {}, &a).ok());
    ASSERT_TRUE(two->TrainStep(batch, {}, &b).ok());
    EXPECT_EQ(a.loss, b.loss) << "step " << i;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i;
  }
  auto other_seed = TinyOptions("bf16_mixed");
  other_seed.seed = 8;
  auto three = MakeSession(other_seed);
  StepStats a, c;
  auto batch = RandomBatch(2, 16, 1);
  ASSERT_TRUE(one->Forward(batch, nullptr).ok());
  ForwardResult fa, fc;
  ASSERT_TRUE(MakeSession(TinyOptions("bf16_mixed"))->Forward(batch, &fa).ok());
  ASSERT_TRUE(three->Forward(batch, &fc).ok());
  EXPECT_NE(fa.loss, fc.loss);
}

TEST(Training, PerCallLearningRateAndClipping) {
  auto batch = RandomBatch(2, 16, 9);
  auto frozen = MakeSession(TinyOptions());
  OptimizerOverrides zero_lr;
  zero_lr.lr = 0.0;
  StepStats s1, s2;
  ASSERT_TRUE(frozen->TrainStep(batch, zero_lr, &s1).ok());
  ASSERT_TRUE(frozen->TrainStep(batch, zero_lr, &s2).ok());
  EXPECT_EQ(s1.loss, s2.loss);  // lr 0 (and weight decay scaled by lr) leaves the weights unchanged
  EXPECT_EQ(s2.lr, 0.0);

  // Clipping changes the update but not the reported (pre-clip) norm.
  auto clipped = MakeSession(TinyOptions());
  auto unclipped = MakeSession(TinyOptions());
  OptimizerOverrides clip;
  clip.max_grad_norm = 1e-3;
  StepStats c1, u1, c2, u2;
  ASSERT_TRUE(clipped->TrainStep(batch, clip, &c1).ok());
  ASSERT_TRUE(unclipped->TrainStep(batch, {}, &u1).ok());
  EXPECT_EQ(c1.grad_norm, u1.grad_norm);
  ASSERT_TRUE(clipped->TrainStep(batch, clip, &c2).ok());
  ASSERT_TRUE(unclipped->TrainStep(batch, {}, &u2).ok());
  // Adam normalises the step size, so with a constant clip factor only eps and the history differ; the
  // losses still differ measurably.
  EXPECT_NE(c2.loss, u2.loss);
}

TEST(Training, BadBatchesAreRefusedAndChangeNothing) {
  auto session = MakeSession(TinyOptions());
  auto good = RandomBatch(2, 8, 11);
  ForwardResult before;
  ASSERT_TRUE(session->Forward(good, &before).ok());

  std::vector<std::pair<std::string, Batch>> bad;
  {
    auto b = good;
    b.input_ids[3] = 256;
    bad.push_back({"outside the vocabulary", b});
  }
  {
    auto b = good;
    b.input_ids[3] = -1;
    bad.push_back({"outside the vocabulary", b});
  }
  {
    auto b = good;
    b.input_ids.pop_back();
    bad.push_back({"input_ids has 15 values", b});
  }
  {
    auto b = good;
    b.labels.assign(b.input_ids.size(), kIgnoreIndex);
    bad.push_back({"no target tokens", b});
  }
  {
    auto b = good;
    b.labels.assign(b.input_ids.size(), 5);
    b.labels[2] = 300;
    bad.push_back({"labels[0][2]", b});
  }
  {
    auto b = good;
    b.loss_weights.assign(b.input_ids.size(), 1.0f);
    b.loss_weights[1] = std::nanf("");
    bad.push_back({"loss_weights[0][1]", b});
  }
  {
    auto b = good;
    b.loss_weights.assign(3, 1.0f);
    bad.push_back({"loss_weights has 3", b});
  }
  {
    Batch b;
    bad.push_back({"must be positive", b});
  }
  // Longer than the model's max_position_embeddings (256): refused here as by the server.
  bad.push_back({"longer than the model's max_position_embeddings 256", RandomBatch(1, 257, 12)});
  for (const auto& [expected, batch] : bad) {
    StepStats stats;
    Status status = session->TrainStep(batch, {}, &stats);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << expected << ": " << status.ToString();
    EXPECT_NE(status.message().find(expected), std::string::npos) << status.message();
    // The one batch contract: the answer the server gives before any lock (tests/server) is this one.
    EXPECT_EQ(status.message(), CheckBatch(batch, BatchLimitsOf(session->Info())).message());
    status = session->ForwardBackward(batch, &stats);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << expected;
  }
  EXPECT_EQ(session->Info().step, 0);
  EXPECT_EQ(session->Info().accumulated_batches, 0);
  ForwardResult after;
  ASSERT_TRUE(session->Forward(good, &after).ok());
  EXPECT_EQ(before.loss, after.loss);

  Status status = session->OptimStep({}, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  OptimizerOverrides bad_lr;
  bad_lr.lr = std::nan("");
  EXPECT_EQ(session->TrainStep(good, bad_lr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Info().step, 0);
}

TEST(Training, ForwardReturnsPerTokenLogProbs) {
  auto session = MakeSession(TinyOptions());
  auto batch = RandomBatch(2, 8, 12);
  batch.labels.assign(batch.input_ids.size(), 3);
  batch.labels[5] = kIgnoreIndex;
  ForwardResult result;
  ASSERT_TRUE(session->Forward(batch, &result).ok());
  ASSERT_EQ(result.logprobs.size(), 16u);
  EXPECT_EQ(result.tokens, 15);
  EXPECT_EQ(result.logprobs[5], 0.0f);
  double sum = 0;
  for (size_t i = 0; i < 16; ++i) {
    if (i != 5) {
      EXPECT_LT(result.logprobs[i], 0.0f);
      sum += result.logprobs[i];
    }
  }
  EXPECT_NEAR(result.loss, -sum / 15, 1e-5);
  // Forward equals the loss a training step reports before its update.
  StepStats stats;
  ASSERT_TRUE(session->ForwardBackward(batch, &stats).ok());
  EXPECT_NEAR(stats.loss, result.loss, 1e-5);
}

TEST(Training, LossWeightsScaleTokens) {
  auto batch = RandomBatch(1, 16, 13);
  auto weighted = batch;
  weighted.loss_weights.assign(16, 0.0f);
  weighted.loss_weights[4] = 1.0f;
  auto session = MakeSession(TinyOptions());
  ForwardResult full, one;
  ASSERT_TRUE(session->Forward(batch, &full).ok());
  ASSERT_TRUE(session->Forward(weighted, &one).ok());
  // loss = sum(w * nll) / target tokens: only position 4 contributes.
  EXPECT_NEAR(one.loss, -full.logprobs[4] / 15.0, 1e-5);
}

TEST(Training, FusedAndReferenceKernelsAgree) {
  for (const std::string& family : SupportedModelFamilies()) {
    auto fused = MakeSession(TinyOptions("fp32", "fused", family));
    auto reference = MakeSession(TinyOptions("fp32", "reference", family));
    ASSERT_TRUE(fused && reference) << family;
    for (int i = 0; i < 3; ++i) {
      auto batch = RandomBatch(2, 16, 40 + i);
      StepStats f, r;
      ASSERT_TRUE(fused->TrainStep(batch, {}, &f).ok()) << family;
      ASSERT_TRUE(reference->TrainStep(batch, {}, &r).ok()) << family;
      EXPECT_NEAR(f.loss, r.loss, 1e-4 * r.loss) << family << " step " << i;
      EXPECT_NEAR(f.grad_norm, r.grad_norm, 1e-3 * r.grad_norm) << family << " step " << i;
    }
  }
}

}  // namespace
}  // namespace tigon
