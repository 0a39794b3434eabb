// sum(x^2) the unfused way: x converted to fp64 as a whole, squared and summed by ATen.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

torch::Tensor squared_norm(const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x64 = x.to(torch::kDouble);
  return (x64 * x64).sum();
}

}  // namespace tigon::reference
