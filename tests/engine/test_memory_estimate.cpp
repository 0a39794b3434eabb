// CreateSession's memory estimate (engine/src/session/memory_estimate.h): a model over --max-parameters or
// over what the device has is refused from its config at once, before anything is allocated, with what it
// needs and what there is; and the estimate is a lower bound of what a session really takes, so it never
// refuses a model that would fit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "engine_test_util.h"
#include "tigon/cpu_memory_limit.h"

namespace tigon {
namespace {



constexpr const char* kOnCpuOnly = "the CPU memory cap applies to CPU sessions; this machine puts sessions on cuda:0";

// 4.7M parameters: big enough that its footprint reads in MiB, small enough for CI.
SessionOptions MediumOptions() {
  SessionOptions o;
  o.config_json = R"({"model_type": "llama", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512})";
  o.precision = "fp32";
  o.seed = 3;
  return o;
}

// "needs at least 75.2 MiB" -> bytes.
double NeededBytes(const std::string& message) {
  const std::string key = "needs at least ";
  const size_t at = message.find(key);
  if (at == std::string::npos) return -1;
  char* end = nullptr;
  const double value = std::strtod(message.c_str() + at + key.size(), &end);
  const std::string unit(end, end + 4);
  return value * (unit == " GiB" ? 1024.0 * 1024.0 * 1024.0 : 1024.0 * 1024.0);
}

struct LimitGuard {
  ~LimitGuard() { SetCpuMemoryLimit(0); }
};

TEST(MemoryEstimate, MaxParametersCountsExactlyTheParametersTheModelHas) {
  SessionOptions options = MediumOptions();
  std::unique_ptr<Session> session;
  ASSERT_TRUE(CreateSession(options, &session).ok());
  const int64_t parameters = session->Info().parameter_count;
  session.reset();
  options.max_parameters = parameters;
  EXPECT_TRUE(CreateSession(options, &session).ok()) << "a model of exactly --max-parameters is accepted";
  session.reset();
  options.max_parameters = parameters - 1;
  const Status refused = CreateSession(options, &session);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find(std::to_string(parameters) + " parameters"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("--max-parameters"), std::string::npos) << refused.message();
  EXPECT_EQ(session, nullptr);
}

TEST(MemoryEstimate, AModelOverTheAvailableMemoryIsRefusedBeforeAnythingIsAllocated) {
  if (!ListDevices().empty()) GTEST_SKIP() << kOnCpuOnly;
  LimitGuard guard;
  const CpuMemoryUsage before = GetCpuMemoryUsage();
  SetCpuMemoryLimit(before.in_use_bytes + (16 << 20));  // 16 MiB of room; the model needs about 80
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Session> session;
  const Status refused = CreateSession(MediumOptions(), &session);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  for (const char* part : {"needs at least", "weights", "optimizer state", "activations of a 512-token step",
                           "cpu has 16.0 MiB available"}) {
    EXPECT_NE(refused.message().find(part), std::string::npos) << part << " in: " << refused.message();
  }
  EXPECT_LT(seconds, 1.0);
  const CpuMemoryUsage after = GetCpuMemoryUsage();
  EXPECT_EQ(after.refused, before.refused) << "no allocation was even tried";
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

TEST(MemoryEstimate, TheEstimateIsALowerBoundOfWhatASessionAndOneStepTake) {
  if (!ListDevices().empty()) GTEST_SKIP() << kOnCpuOnly;
  LimitGuard guard;
  for (const char* precision : {"fp32", "bf16", "bf16_mixed"}) {
    for (bool in_backward : {false, true}) {
      SessionOptions options = MediumOptions();
      options.precision = precision;
      options.optimizer_in_backward = in_backward;
      // The estimate, read from a refusal with no room at all.
      SetCpuMemoryLimit(GetCpuMemoryUsage().in_use_bytes + 1);
      std::unique_ptr<Session> session;
      const Status refused = CreateSession(options, &session);
      ASSERT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
      const double estimate = NeededBytes(refused.message());
      ASSERT_GT(estimate, 0) << refused.message();
      // What the session really takes: its buffers and one step of the estimate's 512 tokens.
      SetCpuMemoryLimit(0);
      const int64_t base = GetCpuMemoryUsage().in_use_bytes;
      ResetCpuMemoryPeak();
      ASSERT_TRUE(CreateSession(options, &session).ok());
      StepStats stats;
      ASSERT_TRUE(session->TrainStep(testing::RandomBatch(1, 512, 5, 4096), {}, &stats).ok());
      const double used = static_cast<double>(GetCpuMemoryUsage().peak_bytes - base);
      session.reset();
      EXPECT_LE(estimate, used) << precision << (in_backward ? " in backward" : "") << ": " << refused.message();
      EXPECT_GE(estimate, 0.4 * used) << precision << (in_backward ? " in backward" : "") << ": the estimate "
                                      << "should be close enough to refuse what cannot fit";
    }
  }
}

}  // namespace
}  // namespace tigon
