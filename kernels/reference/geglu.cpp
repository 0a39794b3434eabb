// Gemma-style gated MLP activation as Hugging Face runs it: gelu_pytorch_tanh(gate) * up.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::gelu(a, /*approximate=*/"tanh") * b;
}

}  // namespace tigon::reference
