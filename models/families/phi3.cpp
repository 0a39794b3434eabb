// Phi3 (model_type "phi3"): q/k/v stored as one qkv_proj and gate/up as one gate_up_proj, no biases;
// partial_rotary_factor is always written into a transformers 5 rope_parameters, as Phi3Config does.
#include "models/families/family.h"

namespace tigon::models {

FamilySpec Phi3Family() {
  FamilySpec spec;
  spec.model_type = "phi3";
  spec.traits.fused_qkv = true;
  spec.traits.fused_gate_up = true;
  spec.write = [](const ModelConfig& config, nlohmann::json& json) {
    if (json.contains("rope_parameters")) json["rope_parameters"]["partial_rotary_factor"] = config.partial_rotary_factor;
  };
  return spec;
}

}  // namespace tigon::models
