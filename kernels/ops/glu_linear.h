// glu_linear for a caller that has no further use of a and b (the decoder's gate and up projections): the
// activation's backward writes grad_a over a and grad_b over b, each where it is contiguous, and, with a's
// buffer taken, writes h = act(a) * b over grad_y @ weight in the same pass, so that the down projection's
// weight gradient needs no second pass over a and b. Backward then holds no more memory at its peak than
// glu_linear does, and one [T, I] buffer less after it. The versions of the buffers taken are bumped: a second
// backward through a retained graph fails instead of reading overwritten values.
#pragma once

#include <torch/types.h>

namespace tigon::ops {

torch::Tensor glu_linear_consuming_inputs(const torch::Tensor& a, const torch::Tensor& b,
                                          const torch::Tensor& weight, const torch::Tensor& bias, bool gelu);

}  // namespace tigon::ops
