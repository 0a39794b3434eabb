// The family registry (models/families/): every registered family has a Hugging Face fixture the parity,
// loading and engine tests pick up, and its spec's traits and defaults reach the parsed ModelConfig.
#include <algorithm>
#include <filesystem>
#include <set>

#include "models/families/family.h"
#include "models/rotary.h"
#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::FixtureDir;
using testing::ModelErrorMessage;

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

// --- Gemma 3 ----------------------------------------------------------------------------------------

// The fixture's config (transformers 5): layer types, the RoPE of each, the attention scale, the norms.
TEST(Gemma3, ConfigReadsLayerTypesRopePerLayerTypeAndScale) {
  const ModelConfig config = ModelConfig::FromJson(testing::ReadConfig("gemma3_text"));
  EXPECT_EQ(config.sliding_window, (std::vector<int64_t>{6, 0, 6}));
  EXPECT_EQ(config.rope_theta, 1000000.0);
  EXPECT_EQ(config.rope_scaling.type, "linear");
  EXPECT_EQ(config.rope_scaling.factor, 2.0);
  EXPECT_EQ(config.local_rope_theta, 10000.0);
  EXPECT_EQ(config.local_rope_scaling.type, "default");
  EXPECT_EQ(config.query_pre_attn_scalar, 16.0);
  EXPECT_TRUE(config.traits.qk_norm && config.traits.sandwich_norms && config.traits.scale_embeddings);
  EXPECT_EQ(config.traits.norm_offset, 1.0);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.hidden_act, "gelu_pytorch_tanh");
}

// Without layer_types, sliding_window_pattern (default 6) makes every pattern-th layer full attention;
// sliding_window defaults to 4096.
TEST(Gemma3, SlidingWindowPatternAndDefaults) {
  nlohmann::json json = testing::ReadConfig("gemma3_text");
  json.erase("layer_types");
  json.erase("_sliding_window_pattern");
  json["sliding_window_pattern"] = 2;
  EXPECT_EQ(ModelConfig::FromJson(json).sliding_window, (std::vector<int64_t>{6, 0, 6}));
  json.erase("sliding_window_pattern");
  json.erase("sliding_window");
  json["num_hidden_layers"] = 7;
  EXPECT_EQ(ModelConfig::FromJson(json).sliding_window,
            (std::vector<int64_t>{4096, 4096, 4096, 4096, 4096, 0, 4096}));
  json["sliding_window_pattern"] = 0;
  EXPECT_NE(ModelErrorMessage([&] { ModelConfig::FromJson(json); }).find("sliding_window_pattern"), std::string::npos);
}

// transformers 4.x writes rope_theta + rope_scaling (full attention) and rope_local_base_freq (sliding):
// the same frequencies as 5.x's nested rope_parameters, and each layout is written back as it came.
TEST(Gemma3, TransformersFourAndFiveRopeLayoutsAgree) {
  const nlohmann::json v5 = testing::ReadConfig("gemma3_text");
  nlohmann::json v4 = v5;
  v4.erase("rope_parameters");
  v4["rope_theta"] = 1000000.0;
  v4["rope_local_base_freq"] = 10000.0;
  v4["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  const ModelConfig a = ModelConfig::FromJson(v5), b = ModelConfig::FromJson(v4);
  for (const bool sliding : {false, true}) {
    EXPECT_TRUE(torch::equal(RopeInverseFrequencies(a, sliding), RopeInverseFrequencies(b, sliding))) << sliding;
  }
  EXPECT_FALSE(torch::equal(RopeInverseFrequencies(a, false), RopeInverseFrequencies(a, true)));
  const nlohmann::json written_v4 = b.ToJson(), written_v5 = a.ToJson();
  EXPECT_FALSE(written_v4.contains("rope_parameters"));
  EXPECT_EQ(written_v4.at("rope_local_base_freq"), 10000.0);
  EXPECT_EQ(written_v5.at("rope_parameters").at("sliding_attention").at("rope_theta"), 10000.0);
  EXPECT_EQ(written_v5.at("rope_parameters").at("full_attention").at("rope_type"), "linear");
  EXPECT_TRUE(written_v5.at("query_pre_attn_scalar").is_number_integer());
  for (const auto& written : {written_v4, written_v5}) {
    const ModelConfig again = ModelConfig::FromJson(written);
    EXPECT_EQ(again.local_rope_theta, 10000.0);
    EXPECT_EQ(again.rope_scaling.factor, 2.0);
    EXPECT_EQ(again.sliding_window, a.sliding_window);
    EXPECT_EQ(again.query_pre_attn_scalar, 16.0);
  }
  // Defaults: 1e6 for full attention, 1e4 for the sliding layers.
  v4.erase("rope_theta");
  v4.erase("rope_local_base_freq");
  const ModelConfig defaults = ModelConfig::FromJson(v4);
  EXPECT_EQ(defaults.rope_theta, 1000000.0);
  EXPECT_EQ(defaults.local_rope_theta, 10000.0);
}

// What the decoder cannot do is refused, naming the field.
TEST(Gemma3, UnsupportedFieldsAreRefused) {
  const nlohmann::json base = testing::ReadConfig("gemma3_text");
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"final_logit_softcapping", 30.0}}, "final_logit_softcapping"},
      {{{"attn_logit_softcapping", 50.0}}, "attn_logit_softcapping"},
      {{{"use_bidirectional_attention", true}}, "use_bidirectional_attention"},
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}, "one entry per layer type"},
      {{{"rope_parameters", {{"global", {{"rope_theta", 1.0}}}}}}, "unknown layer type 'global'"},
      {{{"query_pre_attn_scalar", 0}}, "query_pre_attn_scalar"},
  };
  for (const auto& [patch, expected] : cases) {
    nlohmann::json json = base;
    json.update(patch);
    const std::string message = ModelErrorMessage([&] { ModelConfig::FromJson(json); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
  // Other families refuse a RoPE nested per layer type instead of misreading it.
  nlohmann::json llama = testing::ReadConfig("llama");
  llama["rope_parameters"] = base.at("rope_parameters");
  EXPECT_NE(ModelErrorMessage([&] { ModelConfig::FromJson(llama); }).find("per layer type"), std::string::npos);
}

// Every Gemma 3 feature reaches the fixture's logits: changing any one of them moves the logits well past
// the parity tolerance, so the parity test fails without it.
TEST(Gemma3, FixtureDependsOnEachFeature) {
  const auto expected = ReadSafetensors(FixtureDir("gemma3_text") + "/expected.safetensors");
  const auto weights = ReadSafetensors(FixtureDir("gemma3_text") + "/model.safetensors");
  const auto error = [&](const nlohmann::json& json) {
    const ModelConfig config = ModelConfig::FromJson(json);
    DecoderModel model(config, OpTable::AllReference(config));
    model.LoadStateDict(weights);
    torch::NoGradGuard no_grad;
    return testing::RelativeError(model.Logits(expected.at("input_ids")), expected.at("logits"));
  };
  const nlohmann::json base = testing::ReadConfig("gemma3_text");
  EXPECT_LT(error(base), 1e-4);
  std::vector<std::pair<std::string, nlohmann::json>> variants;
  nlohmann::json json = base;
  json["rope_parameters"]["sliding_attention"]["rope_theta"] = 1000000.0;
  variants.emplace_back("sliding layers' rope base", json);
  json = base;
  json["rope_parameters"]["full_attention"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  variants.emplace_back("full layers' rope scaling", json);
  json = base;
  json["sliding_window"] = 64;
  variants.emplace_back("sliding window", json);
  json = base;
  json["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention"};
  variants.emplace_back("layer types", json);
  json = base;
  json["query_pre_attn_scalar"] = 8;
  variants.emplace_back("query_pre_attn_scalar", json);
  for (const auto& [what, variant] : variants) EXPECT_GT(error(variant), 1e-3) << what;
}

}  // namespace
}  // namespace tigon::models
