// RMSNorm's passes without autograd, over [rows, hidden] (CUDA tensors through kernels/cuda/rms_norm.cu,
// CPU tensors in C++): the autograd functions of rms_norm.cpp and rms_norm_linears.cpp are built on them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "kernels/ops/common.h"

namespace tigon::ops::detail {

// The torch op's int casting argument (0 = Llama, 1 = Gemma, 2 = none); throws for any other value.
RMSNormCasting ToRMSNormCasting(int64_t casting);

// Hugging Face's output dtype: kGemma returns x's dtype, the other modes promote(x, weight).
torch::ScalarType RMSNormOutputType(torch::ScalarType x, torch::ScalarType weight, RMSNormCasting casting);

// x has at least one dim, weight is [x.size(-1)] on x's device.
void CheckRMSNormInputs(const torch::Tensor& x, const torch::Tensor& weight);

// (y = rms_norm(h2d), rstd per row).
std::pair<torch::Tensor, torch::Tensor> RMSNormForward(const torch::Tensor& h2d, const torch::Tensor& weight,
                                                       double eps, double offset, RMSNormCasting casting);

// h = x + residual stored in x's dtype, then (h [rows, hidden], y = rms_norm(h), rstd): Hugging Face
// normalises the rounded sum, and so do both paths.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> AddRMSNormForward(const torch::Tensor& x,
                                                                          const torch::Tensor& residual,
                                                                          const torch::Tensor& weight, double eps,
                                                                          double offset, RMSNormCasting casting);

// (dh, dweight) from dy2d, the normalised input h2d and its rstd; d_residual_out (optional) is added into dh
// before dh is rounded to its dtype.
std::pair<torch::Tensor, torch::Tensor> RMSNormBackward(const torch::Tensor& dy2d, const torch::Tensor& h2d,
                                                        const torch::Tensor& d_residual_out,
                                                        const torch::Tensor& weight, const torch::Tensor& rstd,
                                                        double offset, RMSNormCasting casting);

}  // namespace tigon::ops::detail
