// The model-family registry. A family is one file in this folder defining a FamilySpec: how its Hugging Face
// config.json reads into ModelConfig (the defaults its transformers config class sets, the fields only it
// has) and is written back, and its decoder traits. registry.cpp lists the specs. Nothing outside this
// folder tests a family's name: the decoder, the op table and loading read the parsed ModelConfig.
// models/README.md says step by step what adding a family takes.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/model.h"

namespace tigon::models {

struct FamilySpec {
  std::string model_type;  // config.json's model_type
  FamilyTraits traits;     // copied into every ModelConfig of the family

  // Shared fields whose default or name differs by family.
  int64_t default_head_dim = 0;  // head_dim when config.json has none; 0: hidden_size / num_attention_heads
  bool default_tie_word_embeddings = false;
  std::string activation_field = "hidden_act";  // the field naming the MLP activation
  std::string default_activation = "silu";
  // true: `read` and `write` handle the RoPE fields (RoPE per layer type); false: the shared reader does
  // (rope_theta + rope_scaling, or transformers 5's flat rope_parameters).
  bool rope_per_layer_type = false;

  // Reads what only this family has (biases, sliding windows, attention scale, ...) after the shared fields;
  // throws ModelError naming the field. May be empty.
  std::function<void(const nlohmann::json& json, ModelConfig& config)> read;
  // Writes those fields into `json`, which holds the config as given with the shared fields refreshed.
  std::function<void(const ModelConfig& config, nlohmann::json& json)> write;
};

// Every registered family, sorted by model_type.
const std::vector<FamilySpec>& RegisteredFamilies();
// The spec of `model_type`; throws ModelError listing the supported ones when it is none of them.
const FamilySpec& FamilyFor(const std::string& model_type);

// Typed readers of config.json fields (models/config.cpp). `where` names the object in messages
// ("config", "config.rope_parameters"). A null field counts as absent.
namespace config_fields {
bool Has(const nlohmann::json& json, const char* key);
int64_t GetInt(const nlohmann::json& json, const char* key, const std::string& where);
double GetDouble(const nlohmann::json& json, const char* key, const std::string& where);
bool GetBool(const nlohmann::json& json, const char* key, const std::string& where);
std::string GetString(const nlohmann::json& json, const char* key, const std::string& where);
int64_t IntOr(const nlohmann::json& json, const char* key, int64_t fallback);
double DoubleOr(const nlohmann::json& json, const char* key, double fallback, const std::string& where = "config");
bool BoolOr(const nlohmann::json& json, const char* key, bool fallback);

// One RoPE parameter set (a 4.x rope_scaling, a 5.x rope_parameters, or one layer type's entry of it):
// rope_theta (default_theta when absent), rope_type (or type) and the scaling's fields, checked.
void ReadRope(const nlohmann::json& params, const std::string& where, double default_theta, double& theta,
              RopeScaling& scaling);
// The scaling as transformers writes it (rope_type and the fields that type uses; no rope_theta).
nlohmann::json RopeScalingJson(const RopeScaling& scaling);
}  // namespace config_fields

// Rules several families share (models/families/shared.cpp).
// attention_bias puts biases on q/k/v and o_proj (Llama, Gemma, Qwen3, Gemma 3).
void ReadAttentionBias(const nlohmann::json& json, ModelConfig& config);
void WriteAttentionBias(const ModelConfig& config, nlohmann::json& json);
// The `sliding_window` field: 0 when absent or null; throws unless it is positive.
int64_t SlidingWindowField(const nlohmann::json& json);
// layer_types (one "full_attention" or "sliding_attention" per layer): the sliding layers get `window`.
void ReadLayerTypes(const nlohmann::json& json, int64_t window, ModelConfig& config);
// Qwen2 and Qwen3: a window only with use_sliding_window, on the layers layer_types marks as sliding, or
// else on the layers from max_window_layers on.
void ReadQwenSlidingWindow(const nlohmann::json& json, ModelConfig& config);

}  // namespace tigon::models
