// Gemma-style gated MLP activation as Hugging Face runs it: gelu_pytorch_tanh(gate) * up.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::gelu(a, /*approximate=*/"tanh") * b;
}

void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db) {
  torch::autograd::variable_list grads;
  {
    torch::AutoGradMode enable(true);
    auto a_leaf = a.detach().requires_grad_(true), b_leaf = b.detach().requires_grad_(true);
    grads = torch::autograd::grad({geglu(a_leaf, b_leaf)}, {a_leaf, b_leaf}, {dy.detach()});
  }
  torch::NoGradGuard no_grad;
  da.copy_(grads[0]);
  db.copy_(grads[1]);
}

}  // namespace tigon::reference
