// Gemma 3, text only (model_type "gemma3_text"): Gemma's (1 + weight) RMSNorm in fp32, sqrt(hidden_size)
// embedding scale, tanh GELU, head_dim 256 and tied embeddings by default, plus
//  - q_norm / k_norm over head_dim before RoPE, and four norms per layer (the attention's and the MLP's
//    outputs are normed before their residual add: post_attention_layernorm, post_feedforward_layernorm);
//  - interleaved sliding-window and full-attention layers: layer_types, or else sliding_window_pattern
//    (default 6: every 6th layer full), with sliding_window (default 4096);
//  - a RoPE per layer type: transformers 5 nests rope_parameters {"full_attention": {...},
//    "sliding_attention": {...}}; 4.x has rope_theta (default 1e6) + rope_scaling for the full layers and
//    rope_local_base_freq (default 1e4) for the sliding ones;
//  - attention scale query_pre_attn_scalar ** -0.5 (default 256).
// As Gemma3TextConfig, attention_bias puts biases on q/k/v and o_proj. Logit soft-capping and bidirectional
// attention are refused rather than ignored.
#include <cmath>

#include "models/families/family.h"

namespace tigon::models {
namespace {

using namespace config_fields;

constexpr double kGlobalTheta = 1000000.0;
constexpr double kLocalTheta = 10000.0;

void ReadRopePerLayerType(const nlohmann::json& json, ModelConfig& config) {
  if (Has(json, "rope_parameters")) {
    const nlohmann::json& params = json.at("rope_parameters");
    if (!params.is_object() || params.contains("rope_type") || params.contains("rope_theta") ||
        params.contains("type")) {
      throw ModelError(
          "config.rope_parameters: gemma3_text takes one entry per layer type ({\"full_attention\": {...}, "
          "\"sliding_attention\": {...}})");
    }
    for (const auto& [layer_type, entry] : params.items()) {
      if (layer_type != "full_attention" && layer_type != "sliding_attention") {
        throw ModelError("config.rope_parameters: unknown layer type '" + layer_type +
                         "' (known: full_attention, sliding_attention)");
      }
    }
    const nlohmann::json empty = nlohmann::json::object();
    const auto entry = [&](const char* layer_type) -> const nlohmann::json& {
      return Has(params, layer_type) ? params.at(layer_type) : empty;
    };
    ReadRope(entry("full_attention"), "config.rope_parameters.full_attention", kGlobalTheta, config.rope_theta,
             config.rope_scaling);
    ReadRope(entry("sliding_attention"), "config.rope_parameters.sliding_attention", kLocalTheta,
             config.local_rope_theta, config.local_rope_scaling);
  } else {
    const nlohmann::json scaling = Has(json, "rope_scaling") ? json.at("rope_scaling") : nlohmann::json::object();
    ReadRope(scaling, "config.rope_scaling", DoubleOr(json, "rope_theta", kGlobalTheta), config.rope_theta,
             config.rope_scaling);
    ReadRope(nlohmann::json::object(), "config", DoubleOr(json, "rope_local_base_freq", kLocalTheta),
             config.local_rope_theta, config.local_rope_scaling);
  }
}

void WriteRopePerLayerType(const ModelConfig& config, nlohmann::json& json) {
  const bool v4_style = !json.contains("rope_parameters") &&
                        (json.contains("rope_theta") || json.contains("rope_local_base_freq"));
  if (v4_style) {  // 4.x has no scaling for the sliding layers: theirs is always the default
    json["rope_theta"] = config.rope_theta;
    json["rope_local_base_freq"] = config.local_rope_theta;
    json["rope_scaling"] = config.rope_scaling.type == "default" ? nlohmann::json() : RopeScalingJson(config.rope_scaling);
    return;
  }
  nlohmann::json full = RopeScalingJson(config.rope_scaling);
  full["rope_theta"] = config.rope_theta;
  nlohmann::json sliding = RopeScalingJson(config.local_rope_scaling);
  sliding["rope_theta"] = config.local_rope_theta;
  json["rope_parameters"] = {{"full_attention", full}, {"sliding_attention", sliding}};
  for (const char* key : {"rope_theta", "rope_scaling", "rope_local_base_freq"}) json.erase(key);
}

void ReadGemma3(const nlohmann::json& json, ModelConfig& config) {
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (Has(json, key)) throw ModelError(std::string("config: '") + key + "' is not supported (only null)");
  }
  if (BoolOr(json, "use_bidirectional_attention", false)) {
    throw ModelError("config: 'use_bidirectional_attention' is not supported (causal attention only)");
  }
  ReadAttentionBias(json, config);
  config.query_pre_attn_scalar = DoubleOr(json, "query_pre_attn_scalar", 256.0);
  if (!(config.query_pre_attn_scalar > 0)) {
    throw ModelError("config: query_pre_attn_scalar must be positive, got " +
                     std::to_string(config.query_pre_attn_scalar));
  }
  const int64_t window = Has(json, "sliding_window") ? SlidingWindowField(json) : 4096;
  if (Has(json, "layer_types")) {
    ReadLayerTypes(json, window, config);
  } else {
    const int64_t pattern = IntOr(json, "sliding_window_pattern", 6);
    if (pattern <= 0) {
      throw ModelError("config: sliding_window_pattern must be positive, got " + std::to_string(pattern));
    }
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
      if ((i + 1) % pattern != 0) config.sliding_window[i] = window;
    }
  }
  ReadRopePerLayerType(json, config);
}

}  // namespace

FamilySpec Gemma3TextFamily() {
  FamilySpec spec;
  spec.model_type = "gemma3_text";
  spec.traits.norm_offset = 1.0;
  spec.traits.norm_casting = RMSNormCasting::kGemma;
  spec.traits.scale_embeddings = true;
  spec.traits.qk_norm = true;
  spec.traits.sandwich_norms = true;
  spec.default_head_dim = 256;
  spec.default_tie_word_embeddings = true;
  spec.activation_field = "hidden_activation";
  spec.default_activation = "gelu_pytorch_tanh";
  spec.rope_per_layer_type = true;
  spec.read = ReadGemma3;
  spec.write = [](const ModelConfig& config, nlohmann::json& json) {
    WriteAttentionBias(config, json);
    // An integer in Gemma3TextConfig, whose strict type checks refuse 256.0.
    const double scalar = config.query_pre_attn_scalar;
    if (std::floor(scalar) == scalar && scalar < 9e15) {
      json["query_pre_attn_scalar"] = static_cast<int64_t>(scalar);
    } else {
      json["query_pre_attn_scalar"] = scalar;
    }
    WriteRopePerLayerType(config, json);
  };
  return spec;
}

}  // namespace tigon::models
