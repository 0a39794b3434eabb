// Hugging Face parity: each fixture (a tiny transformers 5.17 model, fp32, eager attention) must give the
// same logits, loss and parameter gradients through our decoder, with the reference and the fused op
// tables. Tolerance 1e-4 relative (max|a-b| / max|b|): fp32 with a different summation order in matmuls
// and fused reductions gives ~1e-6; a wrong cast, offset or rope branch gives >1e-2.
#include <cstdio>

#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::FixtureDir;
using testing::RelativeError;

constexpr double kTolerance = 1e-4;

struct ParityCase {
  std::string family;
  bool fused;
  bool cuda;
};

std::string CaseName(const ::testing::TestParamInfo<ParityCase>& info) {
  return info.param.family + (info.param.fused ? "_fused" : "_reference") + (info.param.cuda ? "_cuda" : "_cpu");
}

class ParityTest : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParityTest, LogitsLossAndGradientsMatchHuggingFace) {
  const auto& [family, fused, cuda] = GetParam();
  // The CUDA cases exist only in CUDA builds (the GPU machine), where a GPU is expected.
  if (cuda) {
    ASSERT_TRUE(torch::cuda::is_available()) << "CUDA build without a usable GPU";
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  const char* where = cuda ? "cuda" : "cpu";
  const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig(family));
  const OpTable table = fused ? OpTable::AllFused(config) : OpTable::AllReference(config);
  auto model = LoadPretrained(FixtureDir(family), &table, torch::kFloat32, device);
  const auto expected = ReadSafetensors(FixtureDir(family) + "/expected.safetensors");
  const torch::Tensor input_ids = expected.at("input_ids").to(device);
  const torch::Tensor labels = expected.at("labels").to(device);

  {
    torch::NoGradGuard no_grad;
    const double logits_error = RelativeError(model->Logits(input_ids), expected.at("logits"));
    EXPECT_LT(logits_error, kTolerance) << family << " logits";
    std::printf("[parity] %-4s %-8s %-9s logits rel err %.3g\n", where, family.c_str(), fused ? "fused" : "reference",
                logits_error);
  }

  const torch::Tensor loss_sum = model->LossSum(input_ids, labels, {});
  EXPECT_EQ(loss_sum.dim(), 0);
  EXPECT_EQ(loss_sum.scalar_type(), torch::kFloat32);
  const double num_valid = labels.ne(-100).sum().item<double>();
  const torch::Tensor loss = loss_sum / num_valid;
  const double loss_error = RelativeError(loss.reshape({1}), expected.at("loss"));
  EXPECT_LT(loss_error, kTolerance) << family << " loss " << loss.item<double>() << " vs "
                                    << expected.at("loss").item<double>();
  loss.backward();

  int grads_checked = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& [key, grad] : expected) {
    if (key.rfind("grad.", 0) != 0) continue;
    const std::string name = key.substr(5);
    const torch::Tensor& param = model->parameter(name);
    ASSERT_TRUE(param.grad().defined()) << name << " got no gradient";
    const double error = RelativeError(param.grad(), grad);
    EXPECT_LT(error, kTolerance) << family << " grad of " << name;
    if (error > worst) worst = error, worst_name = name;
    ++grads_checked;
  }
  EXPECT_GE(grads_checked, 9);
  std::printf("[parity] %-4s %-8s %-9s loss rel err %.3g, %d grads, worst %.3g (%s)\n", where, family.c_str(),
              fused ? "fused" : "reference", loss_error, grads_checked, worst, worst_name.c_str());
}

std::vector<ParityCase> AllCases() {
  std::vector<ParityCase> cases;
  for (const auto& family : testing::Families()) {
    cases.push_back({family, false, false});
    cases.push_back({family, true, false});
#ifdef TIGON_WITH_CUDA  // a CUDA LibTorch (the GPU machine)
    cases.push_back({family, false, true});
    cases.push_back({family, true, true});
#endif
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest, ::testing::ValuesIn(AllCases()), CaseName);

// A mixed table (fused norm and MLP, reference rope and loss) must agree with the all-reference one.
TEST(ParityMixedTable, MixedOpTableMatchesReference) {
  const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig("gemma"));
  OpTable mixed = OpTable::AllReference(config);
  mixed.Set("rms_norm", OpChoice::kFused);
  mixed.Set("geglu", OpChoice::kFused);
  auto model = LoadPretrained(FixtureDir("gemma"), &mixed, torch::kFloat32, torch::kCPU);
  const auto expected = ReadSafetensors(FixtureDir("gemma") + "/expected.safetensors");
  torch::NoGradGuard no_grad;
  EXPECT_LT(RelativeError(model->Logits(expected.at("input_ids")), expected.at("logits")), kTolerance);
}

// Per-token weights scale each token's loss; a zero weight drops the token; TokenLogProbs agrees with the
// loss token by token.
TEST(LossWeights, WeightsScaleAndMaskTokensAndTokenLogProbsAgree) {
  for (const bool fused : {false, true}) {
    const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig("llama"));
    const OpTable table = fused ? OpTable::AllFused(config) : OpTable::AllReference(config);
    auto model = LoadPretrained(FixtureDir("llama"), &table, torch::kFloat32, torch::kCPU);
    const auto expected = ReadSafetensors(FixtureDir("llama") + "/expected.safetensors");
    const torch::Tensor ids = expected.at("input_ids");
    const torch::Tensor labels = expected.at("labels");
    torch::NoGradGuard no_grad;
    const double plain = model->LossSum(ids, labels, {}).item<double>();
    const double doubled = model->LossSum(ids, labels, torch::full(ids.sizes(), 2.0)).item<double>();
    EXPECT_NEAR(doubled, 2 * plain, 1e-5 * plain);

    const torch::Tensor logp = model->TokenLogProbs(ids, labels);
    ASSERT_EQ(logp.sizes(), ids.sizes());
    EXPECT_EQ(logp.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::all(logp.masked_select(labels.eq(-100)) == 0).item<bool>());
    EXPECT_TRUE(torch::all(logp.masked_select(labels.ne(-100)) < 0).item<bool>());
    EXPECT_NEAR(-logp.sum().item<double>(), plain, 1e-5 * plain);
    // Chunks of 5 positions (7 chunks over 32, the last one partial) give the same values.
    EXPECT_TRUE(torch::allclose(model->TokenLogProbs(ids, labels, 5), logp, 1e-6, 1e-6));

    // Zero weight on the second row equals ignoring its labels.
    torch::Tensor weights = torch::ones(ids.sizes());
    weights[1].fill_(0);
    torch::Tensor first_row_only = labels.clone();
    first_row_only[1].fill_(-100);
    const double masked = model->LossSum(ids, labels, weights).item<double>();
    const double ignored = model->LossSum(ids, first_row_only, {}).item<double>();
    EXPECT_NEAR(masked, ignored, 1e-5 * ignored);
    EXPECT_NEAR(-logp[0].sum().item<double>(), ignored, 1e-5 * ignored);
  }
}

// A batch whose labels are all ignored contributes 0 loss and zero (finite) gradients on both tables:
// a fully masked micro-batch must not poison gradient accumulation.
TEST(LossWeights, AllIgnoredLabelsGiveZeroLossAndGradients) {
  const auto expected = ReadSafetensors(FixtureDir("qwen2") + "/expected.safetensors");
  const torch::Tensor ids = expected.at("input_ids");
  const torch::Tensor labels = torch::full(ids.sizes(), -100, torch::kInt32);
  for (const bool fused : {false, true}) {
    const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig("qwen2"));
    const OpTable table = fused ? OpTable::AllFused(config) : OpTable::AllReference(config);
    auto model = LoadPretrained(FixtureDir("qwen2"), &table, torch::kFloat32, torch::kCPU);
    const torch::Tensor loss = model->LossSum(ids, labels, {});
    EXPECT_EQ(loss.item<double>(), 0.0);
    loss.backward();
    for (const auto& p : model->parameters()) {
      if (!p.tensor.grad().defined()) continue;  // no path from a zero loss is fine too
      EXPECT_EQ(p.tensor.grad().abs().max().item<double>(), 0.0) << p.name;
    }
  }
}

// Mistral's sliding window: positions closer than the window to the start see the same keys as with
// full attention, so their logits are unchanged; later ones differ.
TEST(Variants, SlidingWindowChangesOnlyPositionsPastTheWindow) {
  nlohmann::json config = testing::ReadConfig("mistral");
  const auto expected = ReadSafetensors(FixtureDir("mistral") + "/expected.safetensors");
  const auto weights = ReadSafetensors(FixtureDir("mistral") + "/model.safetensors");
  config["sliding_window"] = 4;
  for (const bool fused : {false, true}) {
    const ModelConfig parsed = ModelConfig::FromJson(config);
    DecoderModel model(parsed, fused ? OpTable::AllFused(parsed) : OpTable::AllReference(parsed));
    model.LoadStateDict(weights);
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model.Logits(expected.at("input_ids"));
    const torch::Tensor full = expected.at("logits");
    EXPECT_LT(testing::RelativeError(logits.narrow(1, 0, 4), full.narrow(1, 0, 4)), kTolerance);
    EXPECT_GT(testing::RelativeError(logits.narrow(1, 4, 12), full.narrow(1, 4, 12)), 1e-3);
  }
}

// Partial rotary (Phi-style partial_rotary_factor): the fused rope on the narrowed q/k agrees with the
// reference composition, and the result differs from full rotary.
TEST(Variants, PartialRotaryFusedMatchesReference) {
  nlohmann::json config = testing::ReadConfig("phi3");
  config["rope_parameters"]["partial_rotary_factor"] = 0.5;
  const auto expected = ReadSafetensors(FixtureDir("phi3") + "/expected.safetensors");
  const auto weights = ReadSafetensors(FixtureDir("phi3") + "/model.safetensors");
  const ModelConfig parsed = ModelConfig::FromJson(config);
  DecoderModel reference(parsed, OpTable::AllReference(parsed));
  DecoderModel fused(parsed, OpTable::AllFused(parsed));
  reference.LoadStateDict(weights);
  fused.LoadStateDict(weights);
  const torch::Tensor labels = expected.at("labels");
  const torch::Tensor ref_loss = reference.LossSum(expected.at("input_ids"), labels, {});
  const torch::Tensor fused_loss = fused.LossSum(expected.at("input_ids"), labels, {});
  EXPECT_NEAR(fused_loss.item<double>(), ref_loss.item<double>(), 1e-5 * ref_loss.item<double>());
  ref_loss.backward();
  fused_loss.backward();
  for (size_t i = 0; i < reference.parameters().size(); ++i) {
    EXPECT_LT(testing::RelativeError(fused.parameters()[i].tensor.grad(), reference.parameters()[i].tensor.grad()),
              kTolerance)
        << reference.parameters()[i].name;
  }
  torch::NoGradGuard no_grad;
  EXPECT_GT(testing::RelativeError(reference.Logits(expected.at("input_ids")), expected.at("logits")), 1e-3);
}

// bf16 parameters and activations: the logits follow the fp32 ones to bf16 accuracy. bf16 keeps 8
// mantissa bits (relative step 2^-8 = 0.4%); through two layers, norms and attention the logits' error
// measured against fp32 is about 1-2% of their range, so 5e-2 bounds it while still catching real bugs
// (a wrong norm cast or embedding scale gives > 10%).
TEST(Bf16, LoadsAndLogitsAreCloseToFp32) {
  for (const auto& family : testing::Families()) {
    auto model = LoadPretrained(FixtureDir(family), nullptr, torch::kBFloat16, torch::kCPU);
    for (const auto& p : model->parameters()) ASSERT_EQ(p.tensor.scalar_type(), torch::kBFloat16) << p.name;
    // fp16 loads as the rounded fp32 weights (LibTorch 1.13 has no fp16 CPU matmul; fp16 logits are
    // checked in the CUDA tests).
    auto fp16 = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat16, torch::kCPU);
    auto fp32 = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat32, torch::kCPU);
    EXPECT_EQ(fp16->dtype(), torch::kFloat16);
    for (size_t i = 0; i < fp32->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(fp16->parameters()[i].tensor, fp32->parameters()[i].tensor.to(torch::kFloat16)));
    }
    const auto expected = ReadSafetensors(FixtureDir(family) + "/expected.safetensors");
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model->Logits(expected.at("input_ids"));
    EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
    const double error = RelativeError(logits, expected.at("logits"));
    EXPECT_LT(error, 5e-2) << family;
    EXPECT_GT(error, 0.0) << family << ": bf16 cannot be bit-identical to fp32";
    const double loss = model->LossSum(expected.at("input_ids"), expected.at("labels"), {}).item<double>() /
                        expected.at("labels").ne(-100).sum().item<double>();
    EXPECT_NEAR(loss, expected.at("loss").item<double>(), 2e-2 * expected.at("loss").item<double>()) << family;
    std::printf("[bf16] %-8s logits rel err %.3g, loss %.5f vs %.5f\n", family.c_str(), error, loss,
                expected.at("loss").item<double>());
  }
}

}  // namespace
}  // namespace tigon::models
