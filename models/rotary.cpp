#include "models/rotary.h"

#include <cmath>

namespace tigon::models {

torch::Tensor RopeInverseFrequencies(const ModelConfig& config, bool sliding_layers) {
  const int64_t dim = static_cast<int64_t>(config.head_dim * config.partial_rotary_factor);
  const double theta = sliding_layers ? config.local_rope_theta : config.rope_theta;
  const RopeScaling& scaling = sliding_layers ? config.local_rope_scaling : config.rope_scaling;
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  const torch::Tensor exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim;
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, exponents);
  if (scaling.type == "linear") {
    inv_freq = inv_freq / scaling.factor;
  } else if (scaling.type == "llama3") {
    // transformers' _compute_llama3_parameters: long wavelengths divided by `factor`, short ones kept,
    // the band between interpolated smoothly.
    const double factor = scaling.factor;
    const double low = scaling.low_freq_factor;
    const double high = scaling.high_freq_factor;
    const double old_context_len = static_cast<double>(scaling.original_max_position_embeddings);
    const double low_freq_wavelen = old_context_len / low;
    const double high_freq_wavelen = old_context_len / high;
    const torch::Tensor wavelen = 2 * M_PI / inv_freq;
    torch::Tensor llama = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
    const torch::Tensor smooth = (old_context_len / wavelen - low) / (high - low);
    const torch::Tensor smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const torch::Tensor is_medium =
        (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
    llama = torch::where(is_medium, smoothed, llama);
    inv_freq = llama;
  }
  return inv_freq.contiguous();
}

std::pair<torch::Tensor, torch::Tensor> RopeCosSin(const torch::Tensor& inv_freq, int64_t seq_len, torch::Dtype dtype,
                                                   torch::Device device) {
  torch::NoGradGuard no_grad;
  const torch::Tensor positions =
      torch::arange(seq_len, torch::TensorOptions().dtype(torch::kInt64).device(device)).to(torch::kFloat32);
  // A K=1 matmul in transformers, i.e. one fp32 product per element: the same as this outer product.
  const torch::Tensor freqs = torch::outer(positions, inv_freq.to(device, torch::kFloat32));
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace tigon::models
