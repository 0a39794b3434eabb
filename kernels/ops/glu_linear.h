// glu_linear for a caller that has no further use of b (the decoder's up projection): the activation's
// backward writes grad_b over b's own buffer when b is contiguous and of the gradient's dtype, so backward
// holds one [T, I] buffer fewer at its peak (0.875 GiB for Llama-3-8B at 32,768 tokens). b's version is
// bumped afterwards: a second backward through a retained graph fails instead of reading overwritten values.
#pragma once

#include <torch/types.h>

namespace tigon::ops {

torch::Tensor glu_linear_consuming_b(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& weight,
                                     const torch::Tensor& bias, bool gelu);

}  // namespace tigon::ops
