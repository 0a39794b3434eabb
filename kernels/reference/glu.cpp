// The gated MLP activations as Hugging Face runs them: act_fn(gate) * up, with act_fn = SiLU (Llama-style
// SwiGLU) or gelu_pytorch_tanh (Gemma-style GeGLU); their backward_out takes the gradients by autograd
// through the same composition.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {
namespace {

using Activation = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&);

void BackwardOut(Activation glu, const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                 const torch::Tensor& da, const torch::Tensor& db) {
  torch::autograd::variable_list grads;
  {
    torch::AutoGradMode enable(true);
    auto a_leaf = a.detach().requires_grad_(true), b_leaf = b.detach().requires_grad_(true);
    grads = torch::autograd::grad({glu(a_leaf, b_leaf)}, {a_leaf, b_leaf}, {dy.detach()});
  }
  torch::NoGradGuard no_grad;
  da.copy_(grads[0]);
  db.copy_(grads[1]);
}

}  // namespace

torch::Tensor swiglu(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::silu(a) * b;
}

torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::gelu(a, /*approximate=*/"tanh") * b;
}

void swiglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& da, const torch::Tensor& db) {
  BackwardOut(&swiglu, dy, a, b, da, db);
}

void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db) {
  BackwardOut(&geglu, dy, a, b, da, db);
}

}  // namespace tigon::reference
