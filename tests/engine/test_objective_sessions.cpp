// Objectives through the Session API (engine.h): the optimizer divides by each objective's count, the
// optimizer in backward gives the same update as the ordinary step, accumulation over calls equals one
// call for a per-token objective, Forward reports the step's loss, and data-parallel sessions take the
// per-token objectives on their replicas and refuse the others with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine_test_util.h"
#include "tigon/data_parallel.h"

namespace tigon {
namespace {

using testing::RandomBatch;
using testing::TinyOptions;

std::unique_ptr<Session> Make(SessionOptions options) {
  std::unique_ptr<Session> session;
  options.devices = {};
  DataParallelOptions one;  // the CPU, also on a GPU machine
  one.cpu_replicas = 1;
  const Status status = CreateDataParallelSession(options, one, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

// A batch with explicit labels (a two-token prompt ignored) and the inputs of `loss_fn`.
Batch ObjectiveBatch(const std::string& loss_fn, int64_t rows, int64_t seq, uint64_t seed) {
  Batch batch = RandomBatch(rows, seq, seed);
  batch.labels.resize(batch.input_ids.size());
  for (size_t i = 0; i < batch.labels.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) % seq;
    batch.labels[i] = (t < 2 || t == seq - 1) ? kIgnoreIndex : batch.input_ids[i + 1];
  }
  batch.loss_fn = loss_fn;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  const size_t n = batch.input_ids.size();
  if (loss_fn == "importance_sampling" || loss_fn == "ppo" || loss_fn == "cispo") {
    for (size_t i = 0; i < n; ++i) batch.sampler_logprobs.push_back(-5.5f + 0.3f * normal(rng));
    for (size_t i = 0; i < n; ++i) batch.advantages.push_back(normal(rng));
  }
  if (loss_fn == "dpo" || loss_fn == "kto") {
    for (size_t i = 0; i < n; ++i) batch.reference_logprobs.push_back(-5.5f + 0.3f * normal(rng));
  }
  if (loss_fn == "kto") {
    for (int64_t r = 0; r < rows; ++r) batch.desirable.push_back(r % 3 == 0 ? 0 : 1);
  }
  return batch;
}

double MaxLogprobDifference(Session& a, Session& b, const Batch& probe) {
  ForwardResult fa, fb;
  EXPECT_TRUE(a.Forward(probe, &fa).ok());
  EXPECT_TRUE(b.Forward(probe, &fb).ok());
  double worst = 0;
  for (size_t i = 0; i < fa.logprobs.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(fa.logprobs[i] - fb.logprobs[i])));
  return worst;
}

TEST(ObjectiveSessions, TheOptimizerInBackwardMatchesTheOrdinaryStepForEveryObjective) {
  const Batch probe = RandomBatch(2, 12, 99);
  for (const char* loss_fn : {"importance_sampling", "ppo", "cispo", "dpo", "simpo", "cpo", "orpo", "kto"}) {
    SCOPED_TRACE(loss_fn);
    SessionOptions options = TinyOptions();
    std::unique_ptr<Session> ordinary, in_backward;  // both on the same device (a GPU machine's CUDA device 0)
    ASSERT_TRUE(CreateSession(options, &ordinary).ok());
    options.optimizer_in_backward = true;
    ASSERT_TRUE(CreateSession(options, &in_backward).ok());
    const Batch batch = ObjectiveBatch(loss_fn, 4, 10, 3);
    StepStats a, b;
    ASSERT_TRUE(ordinary->TrainStep(batch, {}, &a).ok());
    const Status status = in_backward->TrainStep(batch, {}, &b);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_NEAR(a.loss, b.loss, 1e-6 * (1 + std::abs(a.loss)));
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm);
    EXPECT_GT(a.grad_norm, 0);
    EXPECT_FALSE(a.metrics.empty());
    EXPECT_EQ(a.metrics.size(), b.metrics.size());
    EXPECT_LT(MaxLogprobDifference(*ordinary, *in_backward, probe), 1e-5);
  }
}

TEST(ObjectiveSessions, APerTokenObjectiveAccumulatesOverCallsAsOneCall) {
  const Batch whole = ObjectiveBatch("ppo", 4, 10, 5);
  auto once = Make(TinyOptions());
  auto twice = Make(TinyOptions());
  StepStats whole_step, first, second, update;
  ASSERT_TRUE(once->TrainStep(whole, {}, &whole_step).ok());
  auto half = [&](int64_t row) {
    Batch part = testing::Rows(whole, row, 2);
    part.loss_fn = whole.loss_fn;
    const size_t begin = static_cast<size_t>(row * whole.seq_len), end = static_cast<size_t>((row + 2) * whole.seq_len);
    part.sampler_logprobs.assign(whole.sampler_logprobs.begin() + begin, whole.sampler_logprobs.begin() + end);
    part.advantages.assign(whole.advantages.begin() + begin, whole.advantages.begin() + end);
    return part;
  };
  ASSERT_TRUE(twice->ForwardBackward(half(0), &first).ok());
  ASSERT_TRUE(twice->ForwardBackward(half(2), &second).ok());
  ASSERT_TRUE(twice->OptimStep({}, &update).ok());
  // The whole batch's loss is the token-weighted mean of its halves', and the update is the same.
  EXPECT_NEAR(whole_step.loss, (first.loss * first.tokens + second.loss * second.tokens) / (first.tokens + second.tokens),
              1e-6);
  EXPECT_NEAR(whole_step.grad_norm, update.grad_norm, 1e-5 * update.grad_norm);
  EXPECT_LT(MaxLogprobDifference(*once, *twice, RandomBatch(2, 12, 98)), 1e-5);
}

TEST(ObjectiveSessions, ForwardReportsTheLossTheStepReports) {
  for (const char* loss_fn : {"cross_entropy", "importance_sampling", "dpo", "orpo", "kto"}) {
    SCOPED_TRACE(loss_fn);
    auto session = Make(TinyOptions());
    const Batch batch = ObjectiveBatch(loss_fn, 4, 10, 7);
    ForwardResult forward;
    ASSERT_TRUE(session->Forward(batch, &forward).ok());
    StepStats step;
    ASSERT_TRUE(session->ForwardBackward(batch, &step).ok());
    EXPECT_NEAR(forward.loss, step.loss, 1e-5 * (1 + std::abs(step.loss)));
    EXPECT_EQ(forward.tokens, step.tokens);
    EXPECT_EQ(forward.metrics.size(), step.metrics.size());
  }
}

TEST(ObjectiveSessions, DataParallelReplicasTakePerTokenObjectivesOnly) {
  DataParallelOptions two;
  two.cpu_replicas = 2;
  std::unique_ptr<Session> parallel;
  ASSERT_TRUE(CreateDataParallelSession(TinyOptions(), two, &parallel).ok());
  auto single = Make(TinyOptions());
  const Batch ppo = ObjectiveBatch("ppo", 4, 10, 9);
  StepStats a, b;
  ASSERT_TRUE(parallel->TrainStep(ppo, {}, &a).ok());
  ASSERT_TRUE(single->TrainStep(ppo, {}, &b).ok());
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * (1 + std::abs(b.loss)));
  EXPECT_NEAR(a.metrics.at("clip_fraction"), b.metrics.at("clip_fraction"), 1e-9);
  EXPECT_LT(MaxLogprobDifference(*parallel, *single, RandomBatch(2, 12, 97)), 1e-5);
  StepStats refused;
  const Status status = parallel->TrainStep(ObjectiveBatch("dpo", 4, 10, 9), {}, &refused);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not available on a data-parallel session"), std::string::npos) << status.ToString();
  EXPECT_EQ(parallel->Info().step, 1);
}

}  // namespace
}  // namespace tigon
