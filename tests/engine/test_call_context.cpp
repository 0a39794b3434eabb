// The call context (engine.h, CallContext): a caller that gave up stops a step before its update, with
// nothing applied; the exceptions the contract lists go on. CPU only, single-device and data-parallel.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "engine_test_util.h"
#include "tigon/data_parallel.h"

namespace tigon {
namespace {

using testing::RandomBatch;
using testing::TinyOptions;

std::unique_ptr<Session> MakeSession(int cpu_replicas = 0) {
  std::unique_ptr<Session> session;
  Status status;
  if (cpu_replicas == 0) {
    status = CreateSession(TinyOptions(), &session);
  } else {
    DataParallelOptions parallel;
    parallel.cpu_replicas = cpu_replicas;
    status = CreateDataParallelSession(TinyOptions(), parallel, &session);
  }
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

// A context that is wanted for its first `wanted_checks` looks, then cancelled; counts the looks.
struct CancelAfter {
  explicit CancelAfter(int wanted_checks) : wanted(wanted_checks) {
    context.cancelled = [this] { return ++checks > wanted; };
  }
  int wanted;
  int checks = 0;
  CallContext context;
};

double Loss(Session& session, const Batch& batch) {
  ForwardResult result;
  EXPECT_TRUE(session.Forward(batch, &result).ok());
  return result.loss;
}

class CallContextTest : public ::testing::TestWithParam<int> {};  // the parameter: CPU replicas (0: none)

TEST_P(CallContextTest, ACallCancelledDuringThePassStopsTrainStepBeforeTheUpdate) {
  auto session = MakeSession(GetParam());
  const Batch batch = RandomBatch(2, 8, 3);
  const double before = Loss(*session, batch);
  CancelAfter cancel(/*wanted_checks=*/1);  // wanted when the step starts, cancelled after the pass
  StepStats stats;
  Status status = session->TrainStep(batch, {}, cancel.context, &stats);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_NE(status.message().find("during the forward and backward pass"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("nothing was applied"), std::string::npos) << status.message();
  EXPECT_EQ(cancel.checks, 2) << "looked at when the step started and again before the update";
  EXPECT_EQ(session->Info().step, 0);
  EXPECT_EQ(session->Info().accumulated_batches, 0) << "the pass's gradients were dropped";
  EXPECT_EQ(Loss(*session, batch), before) << "the weights are unchanged";
  // The session goes on as if the call had not happened.
  ASSERT_TRUE(session->TrainStep(batch, {}, &stats).ok());
  EXPECT_EQ(stats.step, 1);
  EXPECT_NE(Loss(*session, batch), before);
}

TEST_P(CallContextTest, ADeadlineAlreadyPassedRunsNothing) {
  auto session = MakeSession(GetParam());
  const Batch batch = RandomBatch(2, 8, 4);
  CallContext late;
  late.deadline = std::chrono::system_clock::now() - std::chrono::seconds(1);
  StepStats stats;
  Status status = session->TrainStep(batch, {}, late, &stats);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  EXPECT_NE(status.message().find("before the step started"), std::string::npos) << status.message();
  EXPECT_EQ(session->ForwardBackward(batch, late, &stats).code(), StatusCode::kDeadlineExceeded);
  ForwardResult result;
  EXPECT_EQ(session->Forward(batch, late, &result).code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(session->ForwardBackward(batch, &stats).ok());
  EXPECT_EQ(session->OptimStep({}, late, &stats).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(session->Info().step, 0);
  EXPECT_EQ(session->Info().accumulated_batches, 1) << "a refused update leaves the pending gradients";
}

TEST_P(CallContextTest, OnlyTheFirstPendingGradientsAreDroppedAndAJoiningTrainStepGoesOn) {
  auto session = MakeSession(GetParam());
  const Batch batch = RandomBatch(2, 8, 5);
  StepStats stats;
  CancelAfter first(1);
  EXPECT_EQ(session->ForwardBackward(batch, first.context, &stats).code(), StatusCode::kCancelled);
  EXPECT_EQ(session->Info().accumulated_batches, 0);
  ASSERT_TRUE(session->ForwardBackward(batch, &stats).ok());
  // Added to pending gradients, this pass cannot be taken back alone: the call completes.
  CancelAfter second(1);
  ASSERT_TRUE(session->ForwardBackward(batch, second.context, &stats).ok());
  EXPECT_EQ(session->Info().accumulated_batches, 2);
  CancelAfter joining(1);
  Status status = session->TrainStep(batch, {}, joining.context, &stats);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(stats.step, 1);
  EXPECT_EQ(session->Info().accumulated_batches, 0);
}

INSTANTIATE_TEST_SUITE_P(SingleDeviceAndTwoReplicas, CallContextTest, ::testing::Values(0, 2));

TEST(CallContext, TheOptimizerInBackwardIsStoppedOnlyBeforeTheStep) {
  SessionOptions options = TinyOptions();
  options.optimizer_in_backward = true;
  std::unique_ptr<Session> session;
  ASSERT_TRUE(CreateSession(options, &session).ok());
  const Batch batch = RandomBatch(2, 8, 6);
  CancelAfter cancel(1);
  StepStats stats;
  ASSERT_TRUE(session->TrainStep(batch, {}, cancel.context, &stats).ok()) << "the update runs inside backward";
  EXPECT_EQ(stats.step, 1);
  CancelAfter at_once(0);
  EXPECT_EQ(session->TrainStep(batch, {}, at_once.context, &stats).code(), StatusCode::kCancelled);
  EXPECT_EQ(session->Info().step, 1);
}

}  // namespace
}  // namespace tigon
