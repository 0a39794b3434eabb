// Device behaviour of the models layer, run where a GPU is present (the GPU machine): the same random
// weights on every device, bf16 on the GPU close to the fp32 fixture, and CPU/GPU agreement of the
// eval-only paths. The fp32 fixture parity on CUDA is in test_parity.cpp (the *_cuda cases). Compiled
// only against a CUDA LibTorch.
#ifdef TIGON_WITH_CUDA
#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::FixtureDir;

#define REQUIRE_CUDA() ASSERT_TRUE(torch::cuda::is_available()) << "CUDA build without a usable GPU"

TEST(Cuda, RandomInitGivesTheSameWeightsOnCpuAndGpu) {
  REQUIRE_CUDA();
  const auto config = testing::ReadConfig("qwen2");
  auto cpu = CreateRandom(config, nullptr, 5, torch::kFloat32, torch::kCPU);
  auto gpu = CreateRandom(config, nullptr, 5, torch::kFloat32, torch::kCUDA);
  ASSERT_EQ(cpu->parameters().size(), gpu->parameters().size());
  for (size_t i = 0; i < cpu->parameters().size(); ++i) {
    EXPECT_TRUE(gpu->parameters()[i].tensor.is_cuda());
    EXPECT_TRUE(torch::equal(cpu->parameters()[i].tensor, gpu->parameters()[i].tensor.cpu()))
        << cpu->parameters()[i].name;
  }
}

TEST(Cuda, Bf16LogitsCloseToFp32AndTokenLogProbsMatchCpu) {
  REQUIRE_CUDA();
  for (const auto& family : testing::Families()) {
    const auto expected = ReadSafetensors(FixtureDir(family) + "/expected.safetensors");
    const auto ids = expected.at("input_ids").to(torch::kCUDA);
    const auto labels = expected.at("labels").to(torch::kCUDA);
    torch::NoGradGuard no_grad;
    auto bf16 = LoadPretrained(FixtureDir(family), nullptr, torch::kBFloat16, torch::kCUDA);
    // Same bound and reason as the CPU bf16 test (8 mantissa bits through two layers).
    EXPECT_LT(testing::RelativeError(bf16->Logits(ids), expected.at("logits")), 5e-2) << family;
    // fp16 keeps 11 mantissa bits: held to a bound 8x tighter.
    auto fp16 = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat16, torch::kCUDA);
    EXPECT_LT(testing::RelativeError(fp16->Logits(ids), expected.at("logits")), 5e-2 / 8) << family;
    auto fp32_gpu = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat32, torch::kCUDA);
    auto fp32_cpu = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat32, torch::kCPU);
    EXPECT_LT(testing::RelativeError(fp32_gpu->TokenLogProbs(ids, labels),
                                     fp32_cpu->TokenLogProbs(expected.at("input_ids"), expected.at("labels"))),
              1e-4)
        << family;
  }
}

TEST(Cuda, SaveFromGpuLoadsBackBitExact) {
  REQUIRE_CUDA();
  testing::TempDir dir;
  auto gpu = LoadPretrained(FixtureDir("gemma"), nullptr, torch::kBFloat16, torch::kCUDA);
  SavePretrained(*gpu, dir.path());
  auto cpu = LoadPretrained(dir.path(), nullptr, torch::kBFloat16, torch::kCPU);
  for (size_t i = 0; i < gpu->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(gpu->parameters()[i].tensor.cpu(), cpu->parameters()[i].tensor));
  }
}

}  // namespace
}  // namespace tigon::models
#endif  // TIGON_WITH_CUDA
