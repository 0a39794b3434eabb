// Mistral (model_type "mistral"): Llama's layers without biases; sliding_window (null: full attention)
// applies to every layer.
#include "models/families/family.h"

namespace tigon::models {

FamilySpec MistralFamily() {
  FamilySpec spec;
  spec.model_type = "mistral";
  spec.read = [](const nlohmann::json& json, ModelConfig& config) {
    const int64_t window = SlidingWindowField(json);
    config.sliding_window.assign(config.num_hidden_layers, window);
  };
  return spec;
}

}  // namespace tigon::models
