// Gemma (model_type "gemma"): RMSNorm by (1 + weight) in fp32, embeddings scaled by sqrt(hidden_size), the
// tanh GELU from `hidden_activation` (also when an old config says hidden_act "gelu", as GemmaConfig
// does), head_dim 256 and tied embeddings by default, attention_bias on q/k/v and o_proj.
#include "models/families/family.h"

namespace tigon::models {

FamilySpec GemmaFamily() {
  FamilySpec spec;
  spec.model_type = "gemma";
  spec.traits.norm_offset = 1.0;
  spec.traits.norm_casting = RMSNormCasting::kGemma;
  spec.traits.scale_embeddings = true;
  spec.default_head_dim = 256;
  spec.default_tie_word_embeddings = true;
  spec.activation_field = "hidden_activation";
  spec.default_activation = "gelu_pytorch_tanh";
  spec.read = ReadAttentionBias;
  spec.write = WriteAttentionBias;
  return spec;
}

}  // namespace tigon::models
