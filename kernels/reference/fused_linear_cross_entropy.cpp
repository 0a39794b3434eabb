// The unfused linear + cross entropy that Hugging Face runs: lm_head in the input dtype materialises the
// whole [N, V] logits, then the reference cross entropy upcasts them.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor fused_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const torch::Tensor& target,
                                         const CrossEntropyOptions& options, const torch::Tensor& token_weights) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "fused_linear_cross_entropy: hidden must be [N, H] and weight [V, H], got ", hidden.sizes(), " and ",
              weight.sizes());
  const torch::Tensor logits = bias.defined() ? torch::addmm(bias, hidden, weight.t()) : torch::mm(hidden, weight.t());
  return cross_entropy(logits, target, options, token_weights);
}

}  // namespace tigon::reference
