// Data-parallel sessions on CPU replicas (tigon/data_parallel.h): batch splitting, gradient sums in buckets
// during backward, equality with one replica training on the whole batch, accumulation, clipping,
// checkpoints, and failures of one replica that must fail the step everywhere without hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unistd.h>

#include "engine_test_util.h"
#include "test_hooks.h"
#include "tigon/data_parallel.h"

namespace tigon {
namespace {

using testing::RandomBatch;
using testing::TinyOptions;

// The reference: one replica on the CPU, whole batches (a plain session would take CUDA device 0 on a GPU
// machine, where these tests also run).
std::unique_ptr<Session> MakeSingle(const SessionOptions& options) {
  DataParallelOptions one;
  one.cpu_replicas = 1;
  std::unique_ptr<Session> session;
  Status status = CreateDataParallelSession(options, one, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

std::unique_ptr<Session> MakeParallel(const SessionOptions& options, int replicas, DataParallelOptions parallel = {}) {
  parallel.cpu_replicas = replicas;
  std::unique_ptr<Session> session;
  Status status = CreateDataParallelSession(options, parallel, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

// A batch with explicit labels, some ignored, so the rows hold different numbers of target tokens.
Batch UnevenBatch(int64_t rows, int64_t seq, uint64_t seed) {
  Batch batch = RandomBatch(rows, seq, seed);
  batch.labels.resize(batch.input_ids.size());
  for (size_t i = 0; i < batch.labels.size(); ++i) {
    const bool last = (i + 1) % seq == 0;
    batch.labels[i] = (last || (i * 7 + seed) % 5 == 0) ? kIgnoreIndex : batch.input_ids[i + 1];
  }
  // The first row loses most of its targets: replicas get very different token counts.
  for (int64_t t = 0; t < seq - 2; ++t) batch.labels[t] = kIgnoreIndex;
  return batch;
}

double RelativeDifference(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Maximum |a - b| over per-token log-probabilities of the same batch.
double MaxLogprobDifference(Session& a, Session& b, const Batch& batch) {
  ForwardResult fa, fb;
  EXPECT_TRUE(a.Forward(batch, &fa).ok());
  EXPECT_TRUE(b.Forward(batch, &fb).ok());
  EXPECT_EQ(fa.logprobs.size(), fb.logprobs.size());
  double worst = 0;
  for (size_t i = 0; i < fa.logprobs.size() && i < fb.logprobs.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(fa.logprobs[i] - fb.logprobs[i])));
  return worst;
}

// Rows that are all the same: each lands on a different replica in Forward, so equal log-probabilities
// mean equal weights on every replica.
void ExpectReplicasIdentical(Session& session, int replicas) {
  Batch one = RandomBatch(1, 16, 777);
  Batch same;
  same.batch = replicas;
  same.seq_len = one.seq_len;
  for (int r = 0; r < replicas; ++r) same.input_ids.insert(same.input_ids.end(), one.input_ids.begin(), one.input_ids.end());
  ForwardResult result;
  ASSERT_TRUE(session.Forward(same, &result).ok());
  for (int r = 1; r < replicas; ++r)
    for (int64_t t = 0; t < one.seq_len; ++t)
      ASSERT_EQ(result.logprobs[t], result.logprobs[r * one.seq_len + t]) << "replica " << r << " position " << t;
}

TEST(DataParallel, EqualsOneReplicaOnTheWholeBatchFp32) {
  struct Case {
    int replicas;
    int64_t rows;
    int64_t bucket_bytes;
  };
  // Even and uneven splits, one bucket and one bucket per parameter.
  for (const Case c : {Case{2, 4, 0}, Case{2, 5, 1}, Case{3, 7, 4096}, Case{4, 4, 1}}) {
    SCOPED_TRACE("replicas " + std::to_string(c.replicas) + ", rows " + std::to_string(c.rows) + ", bucket bytes " +
                 std::to_string(c.bucket_bytes));
    auto single = MakeSingle(TinyOptions());
    DataParallelOptions parallel;
    parallel.bucket_bytes = c.bucket_bytes;
    auto dp = MakeParallel(TinyOptions(), c.replicas, parallel);
    ASSERT_TRUE(single && dp);
    EXPECT_EQ(dp->Info().parameter_count, single->Info().parameter_count);
    for (int step = 0; step < 4; ++step) {
      const Batch batch = UnevenBatch(c.rows, 24, 50 + step);
      StepStats a, b;
      ASSERT_TRUE(single->TrainStep(batch, {}, &a).ok());
      Status status = dp->TrainStep(batch, {}, &b);
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_EQ(b.tokens, a.tokens);
      EXPECT_EQ(b.step, a.step);
      EXPECT_LT(RelativeDifference(b.loss, a.loss), 1e-5) << "step " << step << ": " << b.loss << " vs " << a.loss;
      EXPECT_LT(RelativeDifference(b.grad_norm, a.grad_norm), 1e-5) << "step " << step;
      DataParallelTimings timings;
      ASSERT_TRUE(LastDataParallelTimings(*dp, &timings));
      EXPECT_EQ(timings.replicas, c.replicas);
      // 21 parameters in the tiny 2-layer Llama: one bucket each at bucket_bytes = 1.
      if (c.bucket_bytes == 1) EXPECT_EQ(timings.buckets, 21);
      // Default size: the matrices in one bucket, the 1-D norm weights in another.
      if (c.bucket_bytes == 0) EXPECT_EQ(timings.buckets, 2);
      // Every parameter gets a gradient, so every bucket starts from the hooks during backward.
      EXPECT_EQ(timings.buckets_after_backward, 0);
    }
    EXPECT_LT(MaxLogprobDifference(*dp, *single, RandomBatch(3, 16, 99)), 1e-4);
    ExpectReplicasIdentical(*dp, c.replicas);
    EXPECT_EQ(dp->Info().step, 4);
  }
  std::unique_ptr<Session> plain;
  ASSERT_TRUE(CreateSession(TinyOptions(), &plain).ok());
  EXPECT_FALSE(LastDataParallelTimings(*plain, nullptr));
  EXPECT_FALSE(testing::SetFaultInjector(*plain, [](int, const std::string&) {}));
}

// The one-replica reference above is itself checked against a plain session (CUDA device 0 on a GPU
// machine, hence the looser tolerance).
TEST(DataParallel, OneReplicaEqualsAPlainSession) {
  std::unique_ptr<Session> plain;
  ASSERT_TRUE(CreateSession(TinyOptions(), &plain).ok());
  auto one = MakeSingle(TinyOptions());
  auto two = MakeParallel(TinyOptions(), 2);
  for (int step = 0; step < 3; ++step) {
    const Batch batch = UnevenBatch(4, 24, 30 + step);
    StepStats p, a, b;
    ASSERT_TRUE(plain->TrainStep(batch, {}, &p).ok());
    ASSERT_TRUE(one->TrainStep(batch, {}, &a).ok());
    ASSERT_TRUE(two->TrainStep(batch, {}, &b).ok());
    EXPECT_EQ(a.tokens, p.tokens);
    EXPECT_EQ(b.tokens, p.tokens);
    EXPECT_LT(RelativeDifference(a.loss, p.loss), 1e-4) << "step " << step;
    EXPECT_LT(RelativeDifference(b.loss, p.loss), 1e-4) << "step " << step;
    EXPECT_LT(RelativeDifference(a.grad_norm, p.grad_norm), 1e-4) << "step " << step;
    EXPECT_LT(RelativeDifference(b.grad_norm, p.grad_norm), 1e-4) << "step " << step;
  }
}

TEST(DataParallel, EqualsOneReplicaInBf16) {
  for (const char* precision : {"bf16", "bf16_mixed"}) {
    SCOPED_TRACE(precision);
    auto single = MakeSingle(TinyOptions(precision));
    DataParallelOptions parallel;
    parallel.bucket_bytes = 8192;
    auto dp = MakeParallel(TinyOptions(precision), 2, parallel);
    for (int step = 0; step < 4; ++step) {
      const Batch batch = UnevenBatch(4, 24, 60 + step);
      StepStats a, b;
      ASSERT_TRUE(single->TrainStep(batch, {}, &a).ok());
      ASSERT_TRUE(dp->TrainStep(batch, {}, &b).ok());
      EXPECT_EQ(b.tokens, a.tokens);
      EXPECT_LT(RelativeDifference(b.loss, a.loss), 2e-2) << "step " << step;
      EXPECT_LT(RelativeDifference(b.grad_norm, a.grad_norm), 5e-2) << "step " << step;
    }
    ExpectReplicasIdentical(*dp, 2);
  }
}

TEST(DataParallel, ARowRangeWithoutTargetsStillTakesPart) {
  // Replica 1 gets rows whose labels are all ignored: its loss has nothing to differentiate, yet it must
  // take part in every gradient sum.
  Batch batch = RandomBatch(4, 16, 5);
  batch.labels.assign(batch.input_ids.size(), kIgnoreIndex);
  for (int64_t i = 0; i < 2 * 16 - 1; ++i) batch.labels[i] = batch.input_ids[i + 1];
  auto single = MakeSingle(TinyOptions());
  auto dp = MakeParallel(TinyOptions(), 2);
  for (int step = 0; step < 3; ++step) {
    StepStats a, b;
    ASSERT_TRUE(single->TrainStep(batch, {}, &a).ok());
    Status status = dp->TrainStep(batch, {}, &b);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_LT(RelativeDifference(b.loss, a.loss), 1e-5);
    EXPECT_LT(RelativeDifference(b.grad_norm, a.grad_norm), 1e-5);
  }
  ExpectReplicasIdentical(*dp, 2);
}

TEST(DataParallel, GradientAccumulationAcrossCalls) {
  auto single = MakeSingle(TinyOptions());
  auto dp = MakeParallel(TinyOptions(), 3, DataParallelOptions{0, 2048});
  for (int step = 0; step < 3; ++step) {
    const Batch first = UnevenBatch(3, 20, 70 + step), second = UnevenBatch(5, 20, 80 + step);
    StepStats a1, a2, a3, b1, b2, b3;
    ASSERT_TRUE(single->ForwardBackward(first, &a1).ok());
    ASSERT_TRUE(single->ForwardBackward(second, &a2).ok());
    ASSERT_TRUE(dp->ForwardBackward(first, &b1).ok());
    ASSERT_TRUE(dp->ForwardBackward(second, &b2).ok());
    EXPECT_EQ(b2.accumulated_batches, 2);
    EXPECT_EQ(dp->Info().accumulated_batches, 2);
    EXPECT_EQ(b1.tokens, a1.tokens);
    EXPECT_EQ(b2.tokens, a2.tokens);
    EXPECT_LT(RelativeDifference(b1.loss, a1.loss), 1e-5);
    EXPECT_LT(RelativeDifference(b2.loss, a2.loss), 1e-5);
    ASSERT_TRUE(single->OptimStep({}, &a3).ok());
    ASSERT_TRUE(dp->OptimStep({}, &b3).ok());
    EXPECT_LT(RelativeDifference(b3.grad_norm, a3.grad_norm), 1e-5) << "step " << step;
    EXPECT_EQ(b3.step, a3.step);
    EXPECT_EQ(dp->Info().accumulated_batches, 0);
  }
  EXPECT_LT(MaxLogprobDifference(*dp, *single, RandomBatch(3, 16, 98)), 1e-4);
  ExpectReplicasIdentical(*dp, 3);
  StepStats none;
  EXPECT_EQ(dp->OptimStep({}, &none).code(), StatusCode::kFailedPrecondition);
}

TEST(DataParallel, DiscardedGradientsAreDroppedOnEveryReplica) {
  auto single = MakeSingle(TinyOptions());
  auto dp = MakeParallel(TinyOptions(), 2);
  ASSERT_TRUE(dp->ForwardBackward(UnevenBatch(4, 16, 1), nullptr).ok());
  ASSERT_TRUE(dp->DiscardGradients().ok());
  EXPECT_EQ(dp->Info().accumulated_batches, 0);
  EXPECT_EQ(dp->OptimStep({}, nullptr).code(), StatusCode::kFailedPrecondition);
  const Batch batch = UnevenBatch(4, 16, 2);
  StepStats a, b;
  ASSERT_TRUE(single->TrainStep(batch, {}, &a).ok());
  ASSERT_TRUE(dp->TrainStep(batch, {}, &b).ok());
  EXPECT_LT(RelativeDifference(b.grad_norm, a.grad_norm), 1e-5);  // nothing of the discarded batch left
  auto in_backward = TinyOptions();
  in_backward.optimizer_in_backward = true;
  std::unique_ptr<Session> session;
  DataParallelOptions parallel;
  parallel.cpu_replicas = 2;
  EXPECT_EQ(CreateDataParallelSession(in_backward, parallel, &session).code(), StatusCode::kInvalidArgument);
}

TEST(DataParallel, ClippingUsesTheGlobalNorm) {
  OptimizerOverrides clip;
  clip.max_grad_norm = 0.05;
  auto single = MakeSingle(TinyOptions());
  auto dp = MakeParallel(TinyOptions(), 2);
  auto unclipped = MakeParallel(TinyOptions(), 2);
  for (int step = 0; step < 3; ++step) {
    const Batch batch = UnevenBatch(4, 24, 90 + step);
    StepStats a, b, u;
    ASSERT_TRUE(single->TrainStep(batch, clip, &a).ok());
    ASSERT_TRUE(dp->TrainStep(batch, clip, &b).ok());
    ASSERT_TRUE(unclipped->TrainStep(batch, {}, &u).ok());
    EXPECT_GT(b.grad_norm, 0.05);  // clipping is active
    EXPECT_LT(RelativeDifference(b.loss, a.loss), 1e-5) << "step " << step;
    EXPECT_LT(RelativeDifference(b.grad_norm, a.grad_norm), 1e-5) << "step " << step;
    // Adam normalises a constant clip factor away; once the factors differ between steps it shows.
    if (step == 2) EXPECT_NE(u.loss, b.loss) << "clipping made no difference";
  }
}

TEST(DataParallel, BatchesTooSmallToSplitAreRefused) {
  auto dp = MakeParallel(TinyOptions(), 3);
  const Batch two_rows = RandomBatch(2, 16, 1);
  StepStats stats;
  Status status = dp->TrainStep(two_rows, {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("cannot be split over 3"), std::string::npos) << status.message();
  EXPECT_EQ(dp->ForwardBackward(two_rows, &stats).code(), StatusCode::kInvalidArgument);
  // Bad input is reported with the whole batch's positions.
  Batch bad = RandomBatch(3, 16, 2);
  bad.input_ids[40] = 1000;
  status = dp->TrainStep(bad, {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("input_ids[2][8]"), std::string::npos) << status.message();
  EXPECT_EQ(status.message(), CheckBatch(bad, BatchLimitsOf(dp->Info())).message()) << "the one batch contract";
  EXPECT_EQ(dp->Info().step, 0);
  EXPECT_EQ(dp->Info().accumulated_batches, 0);
  // Forward needs no collective: fewer rows than replicas is fine, and matches one replica.
  auto single = MakeSingle(TinyOptions());
  EXPECT_LT(MaxLogprobDifference(*dp, *single, two_rows), 1e-5);
}

TEST(DataParallel, DeviceListsAreChecked) {
  std::unique_ptr<Session> session;
  auto options = TinyOptions();
  options.devices = {0, 0};
  Status status = CreateSession(options, &session);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("more than once"), std::string::npos) << status.message();
  options.devices = {0, 1, 99};
  status = CreateSession(options, &session);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("does not exist"), std::string::npos) << status.message();
  DataParallelOptions parallel;
  parallel.cpu_replicas = 2;
  options.devices = {0};
  EXPECT_EQ(CreateDataParallelSession(options, parallel, &session).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(session);
}

TEST(DataParallel, CheckpointRoundTripWithOneReplicaSessions) {
  namespace fs = std::filesystem;
  const auto dir = (fs::temp_directory_path() / ("tigon_dp_ckpt_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  auto dp = MakeParallel(TinyOptions("bf16_mixed"), 2);
  auto single = MakeSingle(TinyOptions("bf16_mixed"));
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(dp->TrainStep(UnevenBatch(4, 16, 10 + step), {}, nullptr).ok());
  }
  ASSERT_TRUE(dp->ForwardBackward(UnevenBatch(2, 16, 3), nullptr).ok());
  EXPECT_EQ(dp->SaveCheckpoint(dir).code(), StatusCode::kFailedPrecondition);  // pending gradients
  ASSERT_TRUE(dp->OptimStep({}, nullptr).ok());
  ASSERT_TRUE(dp->SaveCheckpoint(dir + "/a").ok());
  // A one-device session resumes the data-parallel one exactly ...
  ASSERT_TRUE(single->LoadCheckpoint(dir + "/a").ok());
  EXPECT_EQ(single->Info().step, 3);
  EXPECT_EQ(MaxLogprobDifference(*dp, *single, RandomBatch(1, 16, 4)), 0.0);  // one row: replica 0 alone
  // ... and a data-parallel session loads into every replica.
  auto resumed = MakeParallel(TinyOptions("bf16_mixed"), 2);
  ASSERT_TRUE(resumed->LoadCheckpoint(dir + "/a").ok());
  EXPECT_EQ(resumed->Info().step, 3);
  for (int step = 0; step < 2; ++step) {
    const Batch batch = UnevenBatch(4, 16, 20 + step);
    StepStats a, b;
    ASSERT_TRUE(dp->TrainStep(batch, {}, &a).ok());
    ASSERT_TRUE(resumed->TrainStep(batch, {}, &b).ok());
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  ExpectReplicasIdentical(*resumed, 2);
  EXPECT_EQ(resumed->LoadCheckpoint(dir + "/missing").code(), StatusCode::kNotFound);
  EXPECT_TRUE(resumed->TrainStep(UnevenBatch(4, 16, 30), {}, nullptr).ok());
  fs::remove_all(dir);
}

struct InjectedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A fault injector that throws `what` once on `replica` at `point`, once *state is 0 (-1: not yet).
std::function<void(int, const std::string&)> FailOnce(int replica, std::string point, std::string what,
                                                       std::shared_ptr<int> state) {
  return [=](int r, const std::string& p) {
    if (r == replica && p == point && *state == 0) {
      *state += 1;
      throw InjectedFailure(what);
    }
  };
}

TEST(DataParallel, AFailingReplicaFailsTheStepEverywhereWithoutHanging) {
  struct Case {
    std::string point;
    std::string what;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {"forward_backward", "CUDA out of memory. Tried to allocate 2.00 GiB", StatusCode::kResourceExhausted},
      // What backward's first matmul on a full H200 threw (its thread's cuBLAS handle could not be made).
      {"forward_backward", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
       StatusCode::kResourceExhausted},
      {"bucket:0", "injected device error", StatusCode::kInternal},
      {"bucket:5", "injected device error", StatusCode::kInternal},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.point);
    auto fired = std::make_shared<int>(-1);
    DataParallelOptions parallel;
    parallel.bucket_bytes = 1;  // 21 buckets: later ones fail while others wait inside a sum
    parallel.collective_timeout_seconds = 60;
    auto dp = MakeParallel(TinyOptions(), 3, parallel);
    ASSERT_TRUE(testing::SetFaultInjector(*dp, FailOnce(1, c.point, c.what, fired)));
    auto reference = MakeSingle(TinyOptions());
    const Batch earlier = UnevenBatch(3, 16, 40), batch = UnevenBatch(4, 16, 41);
    // Gradients pending from an earlier call are dropped with the failed one, as on one device.
    ASSERT_TRUE(dp->ForwardBackward(earlier, nullptr).ok());
    *fired = 0;  // arm the injector
    const auto start = std::chrono::steady_clock::now();
    StepStats stats;
    Status status = dp->TrainStep(batch, {}, &stats);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(*fired, 1);
    EXPECT_EQ(status.code(), c.code) << status.ToString();
    EXPECT_NE(status.message().find("replica 1"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(c.what), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("not applied on any of the 3 replicas"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("1 earlier call(s) were dropped"), std::string::npos) << status.message();
    EXPECT_LT(seconds, 20.0) << "a replica waited for the failed one";
    EXPECT_EQ(dp->Info().accumulated_batches, 0);
    EXPECT_EQ(dp->Info().step, 0);
    // Nothing was applied and the session is usable: the next steps equal a fresh session's.
    for (int step = 0; step < 2; ++step) {
      const Batch next = UnevenBatch(4, 16, 42 + step);
      StepStats a, b;
      ASSERT_TRUE(reference->TrainStep(next, {}, &a).ok());
      status = dp->TrainStep(next, {}, &b);
      ASSERT_TRUE(status.ok()) << status.ToString();
      EXPECT_LT(RelativeDifference(b.loss, a.loss), 1e-5);
    }
    ExpectReplicasIdentical(*dp, 3);
  }
}

TEST(DataParallel, AReplicaThatNeverArrivesTimesOut) {
  DataParallelOptions parallel;
  parallel.collective_timeout_seconds = 0.5;
  auto slow_once = std::make_shared<int>(0);
  auto dp = MakeParallel(TinyOptions(), 2, parallel);
  ASSERT_TRUE(testing::SetFaultInjector(*dp, [slow_once](int r, const std::string& point) {
    if (r == 0 && point == "bucket:0" && (*slow_once)++ == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  }));
  StepStats stats;
  Status status = dp->TrainStep(UnevenBatch(2, 16, 1), {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  EXPECT_NE(status.message().find("timed out"), std::string::npos) << status.message();
  EXPECT_EQ(dp->Info().step, 0);
  status = dp->TrainStep(UnevenBatch(2, 16, 1), {}, &stats);
  EXPECT_TRUE(status.ok()) << status.ToString();
  ExpectReplicasIdentical(*dp, 2);
}

// Each replica runs on one long-lived thread of its own: the same for every call of the session (no thread
// is created per step: a thread-local count goes on growing), one per replica, never the caller's.
TEST(DataParallel, EachReplicaKeepsOneThreadAcrossCalls) {
  std::mutex mutex;
  std::map<int, std::set<std::thread::id>> threads;
  std::map<int, int> calls, longest_run_on_one_thread;
  auto dp = MakeParallel(TinyOptions(), 3);
  ASSERT_TRUE(testing::SetFaultInjector(*dp, [&](int r, const std::string& point) {
    if (point != "forward_backward" && point != "optim_step") return;
    thread_local int calls_on_this_thread = 0;
    ++calls_on_this_thread;
    std::lock_guard<std::mutex> lock(mutex);
    threads[r].insert(std::this_thread::get_id());
    calls[r] += 1;
    longest_run_on_one_thread[r] = std::max(longest_run_on_one_thread[r], calls_on_this_thread);
  }));
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(dp->ForwardBackward(UnevenBatch(3, 16, 60 + step), nullptr).ok());
    ASSERT_TRUE(dp->OptimStep({}, nullptr).ok());
    ASSERT_TRUE(dp->TrainStep(UnevenBatch(4, 16, 70 + step), {}, nullptr).ok());
  }
  ASSERT_EQ(threads.size(), 3u);
  std::set<std::thread::id> all;
  for (const auto& [r, ids] : threads) {
    EXPECT_EQ(calls[r], 12) << "replica " << r;
    EXPECT_EQ(longest_run_on_one_thread[r], 12) << "replica " << r << " did not stay on one thread";
    EXPECT_EQ(ids.size(), 1u) << "replica " << r;
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(all.count(std::this_thread::get_id()), 0u);
}

// Every replica reports where its step went (CPU replicas: host time), and the slowest one is the step's.
TEST(DataParallel, TimingsCoverEveryReplica) {
  auto dp = MakeParallel(TinyOptions(), 2);
  StepStats stats;
  ASSERT_TRUE(dp->TrainStep(UnevenBatch(4, 24, 3), {}, &stats).ok());
  DataParallelTimings timings;
  ASSERT_TRUE(LastDataParallelTimings(*dp, &timings));
  ASSERT_EQ(timings.per_replica.size(), 2u);
  double slowest = 0;
  for (size_t r = 0; r < timings.per_replica.size(); ++r) {
    SCOPED_TRACE("replica " + std::to_string(r));
    const ReplicaTimings& t = timings.per_replica[r];
    EXPECT_GT(t.forward_ms, 0.0);
    EXPECT_GT(t.backward_ms, 0.0);
    EXPECT_GE(t.wait_ms, 0.0);
    EXPECT_GT(t.update_ms, 0.0);
    EXPECT_DOUBLE_EQ(t.host_forward_ms, t.forward_ms);
    EXPECT_LE(t.forward_ms + t.backward_ms + t.wait_ms, t.forward_backward_ms + 1e-6);
    slowest = std::max(slowest, t.forward_backward_ms);
  }
  EXPECT_DOUBLE_EQ(timings.forward_backward_ms, slowest);
  EXPECT_LE(timings.forward_backward_ms, 1e3 * stats.wall_seconds + 1e-6);
}

TEST(DataParallel, AnUpdateThatFailsOnOneReplicaBreaksTheSession) {
  auto fired = std::make_shared<int>(0);
  auto dp = MakeParallel(TinyOptions(), 2);
  ASSERT_TRUE(testing::SetFaultInjector(*dp, FailOnce(1, "optim_step", "injected update failure", fired)));
  StepStats stats;
  Status status = dp->TrainStep(UnevenBatch(2, 16, 1), {}, &stats);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("replica 1"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("broken"), std::string::npos) << status.message();
  status = dp->TrainStep(UnevenBatch(2, 16, 1), {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("broken"), std::string::npos) << status.message();
}

// Ranks in separate processes split a batch as a session over several devices does.
TEST(DataParallel, RowsOfRankSplitLikeTheSessionAndTheIdTravelsAsHex) {
  Batch batch = RandomBatch(7, 5, 3);
  batch.labels = batch.input_ids;
  batch.loss_weights.assign(batch.input_ids.size(), 0.5f);
  const int64_t expected_rows[] = {3, 2, 2};  // 7 rows over 3 ranks: the first takes one more
  std::vector<int32_t> joined;
  for (int rank = 0; rank < 3; ++rank) {
    const Batch rows = RowsOfRank(batch, rank, 3);
    EXPECT_EQ(rows.batch, expected_rows[rank]);
    EXPECT_EQ(rows.seq_len, 5);
    EXPECT_EQ(rows.labels.size(), rows.input_ids.size());
    EXPECT_EQ(rows.loss_weights.size(), rows.input_ids.size());
    joined.insert(joined.end(), rows.input_ids.begin(), rows.input_ids.end());
  }
  EXPECT_EQ(joined, batch.input_ids) << "in order, every row once";
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);
  std::string back;
  ASSERT_TRUE(UniqueIdFromHex(UniqueIdToHex(id), &back));
  EXPECT_EQ(back, id);
  EXPECT_EQ(UniqueIdToHex("\x01\xab"), "01ab");
  EXPECT_FALSE(UniqueIdFromHex("abc", &back)) << "odd length";
  EXPECT_FALSE(UniqueIdFromHex("zz", &back)) << "not hex";
}

}  // namespace
}  // namespace tigon
