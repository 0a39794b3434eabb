// Llama-style gated MLP activation as Hugging Face runs it: act_fn(gate) * up with act_fn = SiLU.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor swiglu(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::silu(a) * b;
}

}  // namespace tigon::reference
