// Qwen2 (model_type "qwen2"): q/k/v biases always (whatever attention_bias says), none on o_proj; a
// sliding window only with use_sliding_window (ReadQwenSlidingWindow).
#include "models/families/family.h"

namespace tigon::models {

FamilySpec Qwen2Family() {
  FamilySpec spec;
  spec.model_type = "qwen2";
  spec.read = [](const nlohmann::json& json, ModelConfig& config) {
    config.attention_bias = true;
    config.attention_output_bias = false;
    ReadQwenSlidingWindow(json, config);
  };
  return spec;
}

}  // namespace tigon::models
