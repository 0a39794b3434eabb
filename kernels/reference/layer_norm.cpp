// torch.nn.LayerNorm over the last dim (what Hugging Face models call), bias optional.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
  TORCH_CHECK(x.dim() >= 1, "tigon::reference::layer_norm: x needs at least one dim");
  return torch::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

}  // namespace tigon::reference
