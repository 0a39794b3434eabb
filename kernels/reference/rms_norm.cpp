// Hugging Face's eager RMSNorm, op for op (LlamaRMSNorm, GemmaRMSNorm), and the residual add before it.
// One deliberate difference: where Hugging Face upcasts to float32, float64 inputs stay float64, so that the
// composition can serve as the float64 oracle in tests (identical for bf16, fp16 and fp32 inputs).
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {
namespace {

// Hugging Face's `.to(torch.float32)`, except that float64 is kept.
torch::ScalarType UpcastType(const torch::Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                       RMSNormCasting casting) {
  switch (casting) {
    case RMSNormCasting::kLlama: {
      // LlamaRMSNorm: normalise in fp32, cast back, then `weight * x_hat` (type promotion decides the
      // output dtype, as in Hugging Face).
      const auto input_dtype = x.scalar_type();
      auto h = x.to(UpcastType(x));
      auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
      h = h * torch::rsqrt(variance + eps);
      auto w = offset == 0.0 ? weight : weight + offset;
      return w * h.to(input_dtype);
    }
    case RMSNormCasting::kGemma: {
      // GemmaRMSNorm: everything in fp32 including `(1 + weight)`, cast to the input dtype at the end.
      auto h = x.to(UpcastType(x));
      auto out = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
      out = out * (weight.to(UpcastType(x)) + offset);
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
