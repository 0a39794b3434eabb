// Qwen3 (model_type "qwen3"): Llama's layers plus an RMSNorm over head_dim on each head of q and k before
// RoPE (q_norm, k_norm); attention_bias (default false) on q/k/v and o_proj; head_dim 128 by default;
// sliding windows as Qwen2 (use_sliding_window with layer_types or max_window_layers).
#include "models/families/family.h"

namespace tigon::models {

FamilySpec Qwen3Family() {
  FamilySpec spec;
  spec.model_type = "qwen3";
  spec.traits.qk_norm = true;
  spec.default_head_dim = 128;
  spec.read = [](const nlohmann::json& json, ModelConfig& config) {
    ReadAttentionBias(json, config);
    ReadQwenSlidingWindow(json, config);
  };
  spec.write = WriteAttentionBias;
  return spec;
}

}  // namespace tigon::models
