// Rotary position embedding tables, computed exactly as transformers computes them (fp32, same op order),
// including the "linear" and "llama3" frequency scalings.
#pragma once

#include <torch/types.h>

#include <utility>

#include "models/model.h"

namespace tigon::models {

// inv_freq [rotary_dim / 2], fp32 on the CPU; rotary_dim = head_dim * partial_rotary_factor. From
// rope_theta and rope_scaling, or with sliding_layers from local_rope_theta and local_rope_scaling.
torch::Tensor RopeInverseFrequencies(const ModelConfig& config, bool sliding_layers = false);

// (cos, sin) [seq_len, rotary_dim] for positions 0..seq_len-1, computed in fp32 on `device` and cast to
// `dtype` (Hugging Face's rotary_emb output, both halves duplicated).
std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const torch::Tensor& inv_freq, int64_t seq_len, torch::Dtype dtype,
                                                   torch::Device device);

}  // namespace tigon::models
