// Config rules several families share: attention biases and sliding windows.
#include <algorithm>

#include "models/families/family.h"

namespace tigon::models {

using namespace config_fields;

void ReadAttentionBias(const nlohmann::json& json, ModelConfig& config) {
  config.attention_bias = BoolOr(json, "attention_bias", false);
  config.attention_output_bias = config.attention_bias;
}

void WriteAttentionBias(const ModelConfig& config, nlohmann::json& json) {
  json["attention_bias"] = config.attention_bias;
}

int64_t SlidingWindowField(const nlohmann::json& json) {
  if (!Has(json, "sliding_window")) return 0;
  const int64_t window = GetInt(json, "sliding_window", "config");
  if (window <= 0) {
    throw ModelError("config: field 'sliding_window' must be positive or null, got " + std::to_string(window));
  }
  return window;
}

void ReadLayerTypes(const nlohmann::json& json, int64_t window, ModelConfig& config) {
  const auto& types = json.at("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != config.num_hidden_layers) {
    throw ModelError("config: 'layer_types' must list one type per layer (" +
                     std::to_string(config.num_hidden_layers) + ")");
  }
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (types[i] == "sliding_attention") config.sliding_window[i] = window;
  }
}

void ReadQwenSlidingWindow(const nlohmann::json& json, ModelConfig& config) {
  const int64_t window = SlidingWindowField(json);
  if (window == 0 || !BoolOr(json, "use_sliding_window", false)) return;
  if (Has(json, "layer_types")) {
    ReadLayerTypes(json, window, config);
  } else {
    // Layers from max_window_layers on slide; a negative value means all of them.
    const int64_t first = std::max<int64_t>(IntOr(json, "max_window_layers", 28), 0);
    for (int64_t i = first; i < config.num_hidden_layers; ++i) config.sliding_window[i] = window;
  }
}

}  // namespace tigon::models
