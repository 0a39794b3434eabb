// Hugging Face's eager RMSNorm, op for op (LlamaRMSNorm, GemmaRMSNorm), and the residual add before it.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                       RMSNormCasting casting) {
  switch (casting) {
    case RMSNormCasting::kLlama: {
      // LlamaRMSNorm: normalise in fp32, cast back, then `weight * x_hat` (type promotion decides the
      // output dtype, as in Hugging Face).
      const auto input_dtype = x.scalar_type();
      auto h = x.to(torch::kFloat32);
      auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
      h = h * torch::rsqrt(variance + eps);
      auto w = offset == 0.0 ? weight : weight + offset;
      return w * h.to(input_dtype);
    }
    case RMSNormCasting::kGemma: {
      // GemmaRMSNorm: everything in fp32 including `(1 + weight)`, cast to the input dtype at the end.
      auto h = x.to(torch::kFloat32);
      auto out = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
      out = out * (weight.to(torch::kFloat32) + offset);
      return out.to(x.scalar_type());
    }
    case RMSNormCasting::kNone: {
      auto out = x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
      auto w = offset == 0.0 ? weight : weight + offset;
      return out * w;
    }
  }
  TORCH_CHECK(false, "tigon::reference::rms_norm: unknown casting mode");
}

std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps, double offset,
                                                      RMSNormCasting casting) {
  auto residual_out = x + residual;
  return {rms_norm(residual_out, weight, eps, offset, casting), residual_out};
}

}  // namespace tigon::reference
