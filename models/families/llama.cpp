// Llama 2 and 3 (model_type "llama"): the baseline every trait is measured from. attention_bias puts
// biases on q/k/v and o_proj, mlp_bias on gate/up/down.
#include "models/families/family.h"

namespace tigon::models {

FamilySpec LlamaFamily() {
  FamilySpec spec;
  spec.model_type = "llama";
  spec.read = [](const nlohmann::json& json, ModelConfig& config) {
    ReadAttentionBias(json, config);
    config.mlp_bias = config_fields::BoolOr(json, "mlp_bias", false);
  };
  spec.write = [](const ModelConfig& config, nlohmann::json& json) {
    WriteAttentionBias(config, json);
    json["mlp_bias"] = config.mlp_bias;
  };
  return spec;
}

}  // namespace tigon::models
