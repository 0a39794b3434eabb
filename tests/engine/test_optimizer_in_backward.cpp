// AdamW fused into backward (SessionOptions::optimizer_in_backward): the same training, bit for bit, as
// the ordinary ForwardBackward + OptimStep path for every precision, tied and untied embeddings, fused and
// reference kernels, and mixed with accumulation and clipping (which take the ordinary path); a step that
// applies a non-finite gradient leaves the session broken until a checkpoint is loaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace tigon {
namespace {

namespace fs = std::filesystem;
using testing::RandomBatch;
using testing::TinyOptions;

std::unique_ptr<Session> Make(SessionOptions options, bool in_backward) {
  options.optimizer_in_backward = in_backward;
  std::unique_ptr<Session> session;
  const Status status = CreateSession(options, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("tigon_oib_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> LogProbs(Session& session) {
  ForwardResult result;
  const Status status = session.Forward(RandomBatch(2, 16, 99), &result);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return result.logprobs;
}

// Trains both sessions through the same calls and expects identical losses, weights and optimizer state.
void ExpectSameTraining(Session& plain, Session& fused_in_backward, const std::string& name) {
  for (int step = 0; step < 4; ++step) {
    StepStats a, b;
    const Batch batch = RandomBatch(2 + step % 2, 16, 100 + step);
    ASSERT_TRUE(plain.TrainStep(batch, {}, &a).ok());
    const Status status = fused_in_backward.TrainStep(batch, {}, &b);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_EQ(a.loss, b.loss) << name << " step " << step;
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-9 * a.grad_norm) << name;
    EXPECT_GT(b.grad_norm, 0.0);
  }
  EXPECT_EQ(LogProbs(plain), LogProbs(fused_in_backward)) << name;
  const std::string dir = TempDir(name);
  ASSERT_TRUE(plain.SaveCheckpoint(dir + "/plain").ok());
  ASSERT_TRUE(fused_in_backward.SaveCheckpoint(dir + "/in_backward").ok());
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(ReadBytes(dir + "/plain/" + file), ReadBytes(dir + "/in_backward/" + file)) << name << " " << file;
  }
  fs::remove_all(dir);
}

TEST(OptimizerInBackward, BitIdenticalToTheOrdinaryStepForEveryPrecision) {
  for (const char* precision : {"fp32", "bf16", "bf16_mixed"}) {
    const SessionOptions options = TinyOptions(precision);
    auto plain = Make(options, false);
    auto in_backward = Make(options, true);
    EXPECT_FALSE(plain->Info().optimizer_in_backward);
    EXPECT_TRUE(in_backward->Info().optimizer_in_backward);
    ExpectSameTraining(*plain, *in_backward, precision);
  }
}

TEST(OptimizerInBackward, TiedEmbeddingsAndReferenceKernels) {
  // Gemma ties lm_head to the embedding: one gradient summed from two uses, updated once.
  auto gemma = TinyOptions("fp32", "fused", "gemma");
  auto plain = Make(gemma, false);
  auto in_backward = Make(gemma, true);
  ExpectSameTraining(*plain, *in_backward, "gemma");
  auto reference = TinyOptions("bf16_mixed", "reference", "qwen2");
  auto plain_ref = Make(reference, false);
  auto in_backward_ref = Make(reference, true);
  ExpectSameTraining(*plain_ref, *in_backward_ref, "qwen2_reference");
}

TEST(OptimizerInBackward, AccumulationAndClippingTakeTheOrdinaryPathAndStayIdentical) {
  const SessionOptions options = TinyOptions("fp32");
  auto plain = Make(options, false);
  auto in_backward = Make(options, true);
  for (Session* s : {plain.get(), in_backward.get()}) {
    StepStats stats;
    ASSERT_TRUE(s->TrainStep(RandomBatch(2, 16, 1), {}, &stats).ok());
    ASSERT_TRUE(s->ForwardBackward(RandomBatch(2, 16, 2), &stats).ok());
    ASSERT_TRUE(s->ForwardBackward(RandomBatch(1, 16, 3), &stats).ok());
    ASSERT_TRUE(s->OptimStep({}, &stats).ok());
    OptimizerOverrides clip;
    clip.max_grad_norm = 0.05;  // below the norm: the update is clipped
    ASSERT_TRUE(s->TrainStep(RandomBatch(2, 16, 4), clip, &stats).ok());
    ASSERT_GT(stats.grad_norm, 0.05);
    ASSERT_TRUE(s->TrainStep(RandomBatch(2, 16, 5), {}, &stats).ok());  // in backward again
    EXPECT_EQ(stats.step, 4);
  }
  EXPECT_EQ(LogProbs(*plain), LogProbs(*in_backward));
}

TEST(OptimizerInBackward, RefusedWithSeveralDevices) {
  SessionOptions options = TinyOptions("fp32");
  options.optimizer_in_backward = true;
  options.devices = {0, 1};
  std::unique_ptr<Session> session;
  const Status status = CreateSession(options, &session);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("single-device"), std::string::npos) << status.message();
}

// Overwrites every weight of an fp32 checkpoint with NaN (the safetensors data after its JSON header).
void PoisonWeights(const std::string& checkpoint) {
  const std::string path = checkpoint + "/model.safetensors";
  std::string bytes = ReadBytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), sizeof(header));
  const float nan = std::nanf("");
  for (size_t at = 8 + header; at + sizeof(float) <= bytes.size(); at += sizeof(float))
    std::memcpy(&bytes[at], &nan, sizeof(float));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(OptimizerInBackward, ANonFiniteGradientAlreadyAppliedBreaksTheSessionUntilALoad) {
  const std::string dir = TempDir("nan");
  const SessionOptions options = TinyOptions("fp32");
  auto session = Make(options, true);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/good").ok());
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/nan").ok());
  PoisonWeights(dir + "/nan");
  ASSERT_TRUE(session->LoadCheckpoint(dir + "/nan").ok());
  StepStats stats;
  Status status = session->TrainStep(RandomBatch(2, 16, 7), {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("broken"), std::string::npos) << status.message();
  ForwardResult forward;
  status = session->Forward(RandomBatch(2, 16, 7), &forward);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("load a checkpoint"), std::string::npos) << status.message();
  EXPECT_EQ(session->SaveCheckpoint(dir + "/after").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(session->LoadCheckpoint(dir + "/good").ok());
  status = session->TrainStep(RandomBatch(2, 16, 8), {}, &stats);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(std::isfinite(stats.loss));
  // The ordinary path checks the norm before updating: the same poison only drops the gradients.
  auto plain = Make(options, false);
  ASSERT_TRUE(plain->LoadCheckpoint(dir + "/nan").ok());
  status = plain->TrainStep(RandomBatch(2, 16, 7), {}, &stats);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message().find("broken"), std::string::npos) << status.message();
  ASSERT_TRUE(plain->LoadCheckpoint(dir + "/good").ok());
  EXPECT_TRUE(plain->TrainStep(RandomBatch(2, 16, 8), {}, &stats).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tigon
