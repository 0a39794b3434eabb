// Hugging Face config.json -> ModelConfig, for transformers 4.x (`rope_theta` + `rope_scaling`) and 5.x
// (`rope_parameters`) configs: the fields every family shares here, each family's defaults and own fields
// in its spec (models/families/).
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "models/families/family.h"
#include "models/model.h"

namespace tigon::models {
namespace {

const char* JsonTypeName(const nlohmann::json& value) { return value.type_name(); }

}  // namespace

namespace config_fields {

bool Has(const nlohmann::json& json, const char* key) {
  return json.is_object() && json.contains(key) && !json.at(key).is_null();
}

int64_t GetInt(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json& value = json.at(key);
  if (value.is_number_integer() || value.is_number_unsigned()) {
    return value.get<int64_t>();
  }
  // Some configs write integral sizes as 4096.0.
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  throw ModelError(where + ": field '" + key + "' must be an integer, got " + JsonTypeName(value) + " " + value.dump());
}

double GetDouble(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json& value = json.at(key);
  if (!value.is_number()) {
    throw ModelError(where + ": field '" + key + "' must be a number, got " + JsonTypeName(value) + " " + value.dump());
  }
  return value.get<double>();
}

bool GetBool(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json& value = json.at(key);
  if (!value.is_boolean()) {
    throw ModelError(where + ": field '" + key + "' must be a boolean, got " + JsonTypeName(value) + " " +
                     value.dump());
  }
  return value.get<bool>();
}

std::string GetString(const nlohmann::json& json, const char* key, const std::string& where) {
  const nlohmann::json& value = json.at(key);
  if (!value.is_string()) {
    throw ModelError(where + ": field '" + key + "' must be a string, got " + JsonTypeName(value) + " " + value.dump());
  }
  return value.get<std::string>();
}

int64_t IntOr(const nlohmann::json& json, const char* key, int64_t fallback) {
  return Has(json, key) ? GetInt(json, key, "config") : fallback;
}
double DoubleOr(const nlohmann::json& json, const char* key, double fallback, const std::string& where) {
  return Has(json, key) ? GetDouble(json, key, where) : fallback;
}
bool BoolOr(const nlohmann::json& json, const char* key, bool fallback) {
  return Has(json, key) ? GetBool(json, key, "config") : fallback;
}

void ReadRope(const nlohmann::json& params, const std::string& where, double default_theta, double& theta,
              RopeScaling& scaling) {
  if (!params.is_object()) {
    throw ModelError(where + " must be an object, got " + JsonTypeName(params));
  }
  theta = Has(params, "rope_theta") ? GetDouble(params, "rope_theta", where) : default_theta;
  if (!(theta > 0)) {
    throw ModelError("config: rope_theta must be positive, got " + std::to_string(theta));
  }
  std::string type = "default";
  if (Has(params, "rope_type")) {
    type = GetString(params, "rope_type", where);
  } else if (Has(params, "type")) {
    type = GetString(params, "type", where);
  }
  if (type != "default" && type != "linear" && type != "llama3") {
    throw ModelError("config: unsupported rope type '" + type + "' (supported: default, linear, llama3)");
  }
  scaling.type = type;
  scaling.factor = DoubleOr(params, "factor", 1.0, where);
  scaling.low_freq_factor = DoubleOr(params, "low_freq_factor", 1.0, where);
  scaling.high_freq_factor = DoubleOr(params, "high_freq_factor", 4.0, where);
  scaling.original_max_position_embeddings =
      Has(params, "original_max_position_embeddings") ? GetInt(params, "original_max_position_embeddings", where) : 0;
  if (type != "default" && !(scaling.factor > 0)) {
    throw ModelError(where + ": rope factor must be positive, got " + std::to_string(scaling.factor));
  }
  if (type == "llama3") {
    if (scaling.original_max_position_embeddings <= 0) {
      throw ModelError(where + ": llama3 rope scaling needs a positive 'original_max_position_embeddings'");
    }
    if (!(scaling.high_freq_factor > scaling.low_freq_factor) || !(scaling.low_freq_factor > 0)) {
      throw ModelError(where + ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
    }
  }
}

nlohmann::json RopeScalingJson(const RopeScaling& scaling) {
  nlohmann::json rope = nlohmann::json::object();
  rope["rope_type"] = scaling.type;
  if (scaling.type != "default") rope["factor"] = scaling.factor;
  if (scaling.type == "llama3") {
    rope["low_freq_factor"] = scaling.low_freq_factor;
    rope["high_freq_factor"] = scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = scaling.original_max_position_embeddings;
  }
  return rope;
}

}  // namespace config_fields

namespace {

using namespace config_fields;

int64_t RequireInt(const nlohmann::json& json, const char* key) {
  if (!Has(json, key)) {
    throw ModelError("config: missing required field '" + std::string(key) + "'");
  }
  return GetInt(json, key, "config");
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// Caps far past every released model (the largest have a 262,144-token vocabulary, hidden 16,384 to
// 25,600, intermediate 73,728, 126 layers, 128 heads of at most 256): a config past one is a mistake or
// an attack, refused before anything is sized by it. Under the caps no product of sizes overflows int64;
// whether the model fits the device is the engine's memory estimate's to say, before it allocates.
constexpr int64_t kMaxVocabulary = int64_t{1} << 22;
constexpr int64_t kMaxHidden = int64_t{1} << 16;
constexpr int64_t kMaxIntermediate = int64_t{1} << 18;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxHeadDim = 1024;
constexpr int64_t kMaxPositions = int64_t{1} << 26;

void RequirePositive(int64_t value, const char* key, int64_t max_value) {
  if (value <= 0) {
    throw ModelError("config: field '" + std::string(key) + "' must be positive, got " + std::to_string(value));
  }
  if (value > max_value) {
    throw ModelError("config: field '" + std::string(key) + "' = " + std::to_string(value) + " is larger than " +
                     std::to_string(max_value));
  }
}

// transformers 5: rope_parameters {rope_theta, rope_type, factor, ...}; 4.x: rope_theta at the top and
// rope_scaling {type|rope_type, factor, ...} or null. (RoPE per layer type is the family's to read.)
void ParseRope(const nlohmann::json& json, ModelConfig& config) {
  nlohmann::json params = nlohmann::json::object();
  std::string where = "config";
  if (Has(json, "rope_parameters")) {
    params = json.at("rope_parameters");
    where = "config.rope_parameters";
  } else if (Has(json, "rope_scaling")) {
    params = json.at("rope_scaling");
    where = "config.rope_scaling";
  }
  if (params.is_object() && (params.contains("full_attention") || params.contains("sliding_attention"))) {
    throw ModelError(where + ": a RoPE per layer type is not supported by model_type '" + config.family + "'");
  }
  ReadRope(params, where, DoubleOr(json, "rope_theta", 10000.0, "config"), config.rope_theta, config.rope_scaling);
  config.partial_rotary_factor = Has(params, "partial_rotary_factor")
                                     ? GetDouble(params, "partial_rotary_factor", where)
                                     : DoubleOr(json, "partial_rotary_factor", 1.0, "config");
  if (!(config.partial_rotary_factor > 0 && config.partial_rotary_factor <= 1)) {
    throw ModelError("config: partial_rotary_factor must be in (0, 1], got " +
                     std::to_string(config.partial_rotary_factor));
  }
}

}  // namespace

ModelConfig ModelConfig::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    throw ModelError(std::string("config: expected a JSON object, got ") + JsonTypeName(json));
  }
  ModelConfig config;
  config.raw = json;
  if (!Has(json, "model_type")) {
    throw ModelError("config: missing required field 'model_type' (supported: " + Join(SupportedFamilies()) + ")");
  }
  const FamilySpec& spec = FamilyFor(GetString(json, "model_type", "config"));
  config.family = spec.model_type;
  config.traits = spec.traits;

  config.vocab_size = RequireInt(json, "vocab_size");
  config.hidden_size = RequireInt(json, "hidden_size");
  config.intermediate_size = RequireInt(json, "intermediate_size");
  config.num_hidden_layers = RequireInt(json, "num_hidden_layers");
  config.num_attention_heads = RequireInt(json, "num_attention_heads");
  RequirePositive(config.vocab_size, "vocab_size", kMaxVocabulary);
  RequirePositive(config.hidden_size, "hidden_size", kMaxHidden);
  RequirePositive(config.intermediate_size, "intermediate_size", kMaxIntermediate);
  RequirePositive(config.num_hidden_layers, "num_hidden_layers", kMaxLayers);
  RequirePositive(config.num_attention_heads, "num_attention_heads", kMaxHeads);
  config.num_key_value_heads = IntOr(json, "num_key_value_heads", config.num_attention_heads);
  RequirePositive(config.num_key_value_heads, "num_key_value_heads", kMaxHeads);
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    throw ModelError("config: num_attention_heads (" + std::to_string(config.num_attention_heads) +
                     ") must be a multiple of num_key_value_heads (" + std::to_string(config.num_key_value_heads) +
                     ")");
  }
  // Some families default head_dim to a constant (Gemma's 256); the others derive it from hidden_size.
  if (Has(json, "head_dim")) {
    config.head_dim = GetInt(json, "head_dim", "config");
  } else if (spec.default_head_dim > 0) {
    config.head_dim = spec.default_head_dim;
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      throw ModelError("config: hidden_size (" + std::to_string(config.hidden_size) +
                       ") is not divisible by num_attention_heads (" + std::to_string(config.num_attention_heads) +
                       ") and no head_dim is given");
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  RequirePositive(config.head_dim, "head_dim", kMaxHeadDim);
  // A limit of 0 or less would turn the sequence-length check off; absent means 2048.
  config.max_position_embeddings = IntOr(json, "max_position_embeddings", 2048);
  RequirePositive(config.max_position_embeddings, "max_position_embeddings", kMaxPositions);
  config.rms_norm_eps = DoubleOr(json, "rms_norm_eps", 1e-6, "config");
  if (!(config.rms_norm_eps >= 0)) throw ModelError("config: rms_norm_eps must be non-negative");
  config.initializer_range = DoubleOr(json, "initializer_range", 0.02, "config");
  config.tie_word_embeddings = BoolOr(json, "tie_word_embeddings", spec.default_tie_word_embeddings);

  const char* activation = spec.activation_field.c_str();
  config.hidden_act = Has(json, activation) ? GetString(json, activation, "config") : spec.default_activation;
  if (config.hidden_act == "gelu_tanh") config.hidden_act = "gelu_pytorch_tanh";
  if (config.hidden_act != "silu" && config.hidden_act != "gelu_pytorch_tanh") {
    throw ModelError("config: unsupported activation '" + config.hidden_act + "' (supported: silu, gelu_pytorch_tanh)");
  }

  if (!spec.rope_per_layer_type) ParseRope(json, config);
  config.sliding_window.assign(config.num_hidden_layers, 0);
  SlidingWindowField(json);  // a present window must be positive, whether the family uses it or not
  if (spec.read) spec.read(json, config);
  const int64_t rotary_dim = static_cast<int64_t>(config.head_dim * config.partial_rotary_factor);
  if (rotary_dim < 2 || rotary_dim % 2 != 0) {
    throw ModelError("config: the rotary dimension (head_dim * partial_rotary_factor = " + std::to_string(rotary_dim) +
                     ") must be a positive even number");
  }
  return config;
}

nlohmann::json ModelConfig::ToJson() const {
  const FamilySpec& spec = FamilyFor(family);
  nlohmann::json json = raw.is_object() ? raw : nlohmann::json::object();
  json["model_type"] = family;
  json["vocab_size"] = vocab_size;
  json["hidden_size"] = hidden_size;
  json["intermediate_size"] = intermediate_size;
  json["num_hidden_layers"] = num_hidden_layers;
  json["num_attention_heads"] = num_attention_heads;
  json["num_key_value_heads"] = num_key_value_heads;
  if (json.contains("head_dim") || spec.default_head_dim > 0 || head_dim * num_attention_heads != hidden_size) {
    json["head_dim"] = head_dim;
  }
  json["max_position_embeddings"] = max_position_embeddings;
  json["rms_norm_eps"] = rms_norm_eps;
  json["initializer_range"] = initializer_range;
  json["tie_word_embeddings"] = tie_word_embeddings;
  json[spec.activation_field] = hidden_act;

  if (!spec.rope_per_layer_type) {
    nlohmann::json rope = RopeScalingJson(rope_scaling);
    const bool v4_style = !json.contains("rope_parameters") && json.contains("rope_theta");
    if (v4_style) {
      json["rope_theta"] = rope_theta;
      if (partial_rotary_factor != 1.0 || json.contains("partial_rotary_factor")) {
        json["partial_rotary_factor"] = partial_rotary_factor;
      }
      json["rope_scaling"] = rope_scaling.type == "default" ? nlohmann::json() : rope;
    } else {
      rope["rope_theta"] = rope_theta;
      if (partial_rotary_factor != 1.0) rope["partial_rotary_factor"] = partial_rotary_factor;
      json["rope_parameters"] = rope;
      json.erase("rope_scaling");
      json.erase("rope_theta");
    }
  }
  if (spec.write) spec.write(*this, json);
  return json;
}

}  // namespace tigon::models
