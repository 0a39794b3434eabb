// The family registry (models/families/): every registered family has a Hugging Face fixture the parity,
// loading and engine tests pick up, and its spec's traits and defaults reach the parsed ModelConfig.
#include <algorithm>
#include <filesystem>
#include <set>

#include "models/families/family.h"
#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::FixtureDir;

TEST(Registry, FamiliesAreSortedUniqueAndEachHasAFixture) {
  const auto families = SupportedFamilies();
  ASSERT_GE(families.size(), 5u);
  EXPECT_TRUE(std::is_sorted(families.begin(), families.end()));
  EXPECT_EQ(std::set<std::string>(families.begin(), families.end()).size(), families.size());
  for (const auto& family : families) {
    for (const char* file : {"config.json", "model.safetensors", "expected.safetensors"}) {
      EXPECT_TRUE(std::filesystem::exists(FixtureDir(family) + "/" + file)) << family << " has no fixture " << file;
    }
    const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig(family));
    EXPECT_EQ(config.family, family);
    EXPECT_EQ(&FamilyFor(family), &FamilyFor(config.family));
    EXPECT_EQ(FamilyFor(family).model_type, family);
  }
}

// Each spec's traits and defaults are what the parsed config carries: a config with only the sizes gets the
// family's head_dim, tied embeddings and activation.
TEST(Registry, SpecDefaultsAndTraitsReachTheConfig) {
  for (const auto& spec : RegisteredFamilies()) {
    const nlohmann::json sizes = {{"model_type", spec.model_type}, {"vocab_size", 64},         {"hidden_size", 32},
                                  {"intermediate_size", 64},       {"num_hidden_layers", 2},   {"num_attention_heads", 4}};
    const ModelConfig config = ModelConfig::FromJson(sizes);
    EXPECT_EQ(config.head_dim, spec.default_head_dim > 0 ? spec.default_head_dim : 8) << spec.model_type;
    EXPECT_EQ(config.tie_word_embeddings, spec.default_tie_word_embeddings) << spec.model_type;
    EXPECT_EQ(config.hidden_act, spec.default_activation) << spec.model_type;
    EXPECT_EQ(config.traits.fused_qkv, spec.traits.fused_qkv) << spec.model_type;
    EXPECT_EQ(config.traits.norm_offset, spec.traits.norm_offset) << spec.model_type;
    EXPECT_EQ(config.traits.qk_norm, spec.traits.qk_norm) << spec.model_type;
    EXPECT_EQ(config.traits.sandwich_norms, spec.traits.sandwich_norms) << spec.model_type;
    // What ToJson writes reads back to the same config.
    const ModelConfig again = ModelConfig::FromJson(config.ToJson());
    EXPECT_EQ(again.head_dim, config.head_dim) << spec.model_type;
    EXPECT_EQ(again.tie_word_embeddings, config.tie_word_embeddings) << spec.model_type;
    EXPECT_EQ(again.sliding_window, config.sliding_window) << spec.model_type;
    EXPECT_EQ(again.rope_theta, config.rope_theta) << spec.model_type;
    EXPECT_EQ(again.local_rope_theta, config.local_rope_theta) << spec.model_type;
  }
}

// The decoder's parameters follow the traits: fused projections, q/k norms and the four-norm layer.
TEST(Registry, ParameterNamesFollowTheTraits) {
  for (const auto& family : SupportedFamilies()) {
    const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig(family));
    const DecoderModel model(config, OpTable::AllReference(config));
    std::set<std::string> names;
    for (const auto& p : model.parameters()) names.insert(p.name);
    const std::string p = "model.layers.0.";
    const FamilyTraits& t = config.traits;
    EXPECT_EQ(names.count(p + "self_attn.qkv_proj.weight"), t.fused_qkv ? 1u : 0u) << family;
    EXPECT_EQ(names.count(p + "self_attn.q_proj.weight"), t.fused_qkv ? 0u : 1u) << family;
    EXPECT_EQ(names.count(p + "mlp.gate_up_proj.weight"), t.fused_gate_up ? 1u : 0u) << family;
    EXPECT_EQ(names.count(p + "self_attn.q_norm.weight"), t.qk_norm ? 1u : 0u) << family;
    EXPECT_EQ(names.count(p + "self_attn.k_norm.weight"), t.qk_norm ? 1u : 0u) << family;
    EXPECT_EQ(names.count(p + "pre_feedforward_layernorm.weight"), t.sandwich_norms ? 1u : 0u) << family;
    EXPECT_EQ(names.count(p + "post_feedforward_layernorm.weight"), t.sandwich_norms ? 1u : 0u) << family;
    EXPECT_EQ(names.count("lm_head.weight"), config.tie_word_embeddings ? 0u : 1u) << family;
  }
}

// --- Qwen3 ------------------------------------------------------------------------------------------

// Qwen3Config: head_dim 128 unless given, no biases unless attention_bias (then on q/k/v and o_proj),
// sliding windows as Qwen2.
TEST(Qwen3, ConfigDefaultsBiasesAndSlidingWindow) {
  nlohmann::json json = testing::ReadConfig("qwen3");
  const ModelConfig config = ModelConfig::FromJson(json);
  EXPECT_TRUE(config.traits.qk_norm);
  EXPECT_EQ(config.head_dim, 8);
  EXPECT_FALSE(config.attention_bias);
  EXPECT_FALSE(config.attention_output_bias);
  EXPECT_EQ(config.sliding_window, (std::vector<int64_t>{0, 0}));
  json.erase("head_dim");
  EXPECT_EQ(ModelConfig::FromJson(json).head_dim, 128);
  json["head_dim"] = 8;
  json["attention_bias"] = true;
  json["use_sliding_window"] = true;
  json["sliding_window"] = 4;
  json["layer_types"] = {"full_attention", "sliding_attention"};
  const ModelConfig biased = ModelConfig::FromJson(json);
  EXPECT_TRUE(biased.attention_bias);
  EXPECT_TRUE(biased.attention_output_bias);
  EXPECT_EQ(biased.sliding_window, (std::vector<int64_t>{0, 4}));
  DecoderModel model(biased, OpTable::AllReference(biased));
  std::set<std::string> names;
  for (const auto& p : model.parameters()) names.insert(p.name);
  for (const char* name : {"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias", "q_norm.weight"}) {
    EXPECT_EQ(names.count(std::string("model.layers.1.self_attn.") + name), 1u) << name;
  }
  EXPECT_EQ(model.parameter("model.layers.0.self_attn.k_norm.weight").sizes().vec(), std::vector<int64_t>{8});
}

// The q/k norms reach the logits: with them set to the identity the fixture's logits no longer match, so
// the parity test would fail without them.
TEST(Qwen3, FixtureDependsOnTheQkNorms) {
  auto model = LoadPretrained(FixtureDir("qwen3"), nullptr, torch::kFloat32, torch::kCPU);
  const auto expected = ReadSafetensors(FixtureDir("qwen3") + "/expected.safetensors");
  torch::NoGradGuard no_grad;
  EXPECT_LT(testing::RelativeError(model->Logits(expected.at("input_ids")), expected.at("logits")), 1e-4);
  for (auto& p : model->parameters()) {
    if (p.name.find("q_norm") != std::string::npos || p.name.find("k_norm") != std::string::npos) p.tensor.fill_(1.0);
  }
  EXPECT_GT(testing::RelativeError(model->Logits(expected.at("input_ids")), expected.at("logits")), 1e-3);
}

}  // namespace
}  // namespace tigon::models
