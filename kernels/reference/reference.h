// The unfused Hugging Face compositions (namespace tigon::reference): the baseline path and the oracle
// the fused ops are tested against. Same signatures as kernels/ops/ops.h; plain ATen calls, autograd
// through ATen.

#pragma once
#include <torch/types.h>

#include <tuple>

#include "kernels/ops/common.h"

namespace tigon::reference {

// y = x * rsqrt(mean(x^2) + eps) * (offset + weight); x [..., H], weight [H]. Saves the per-row rstd.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                       RMSNormCasting casting);

// residual_out = x + residual; y = rms_norm(residual_out). Returns (y, residual_out).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps, double offset,
                                                      RMSNormCasting casting);

// y = (x - mean) * rstd * weight + bias over the last dim. Saves mean and rstd per row.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps);

// Rotary embedding, half-split (rotate_half) layout. q [B, Hq, T, D], k [B, Hk, T, D],
// cos/sin [T, D] or [B, T, D] (Hugging Face's, already duplicated over both halves). Returns (q', k').
std::tuple<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k,
                                              const torch::Tensor& cos, const torch::Tensor& sin);

// silu(a) * b. Saves a and b; recomputes silu in backward.
torch::Tensor swiglu(const torch::Tensor& a, const torch::Tensor& b);

// gelu_tanh(a) * b. Saves a and b; recomputes gelu in backward.
torch::Tensor geglu(const torch::Tensor& a, const torch::Tensor& b);

// The gradients of swiglu / geglu above (autograd through them) written into da and db; computed in full
// before either is stored, so da or db may be dy, a or b itself.
void swiglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& da, const torch::Tensor& db);
void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db);

// logits [N, V], target [N] (int64). token_weights [N] (optional, float) multiplies each token's loss;
// kMean still divides by the count of non-ignored targets. Computes the gradient during forward.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                            const CrossEntropyOptions& options, const torch::Tensor& token_weights = {});

// cross_entropy(hidden @ weight^T + bias, target) without materialising the [N, V] logits:
// hidden [N, H], weight [V, H], bias [V] or undefined.
torch::Tensor fused_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const torch::Tensor& target,
                                         const CrossEntropyOptions& options,
                                         const torch::Tensor& token_weights = {});

// One AdamW update, in place, over flat buffers of equal length (no autograd).
// param: fp32/bf16/fp16; grad: same dtype as param or fp32; exp_avg/exp_avg_sq: fp32 or param's dtype.
// param_copy (optional, e.g. the bf16 model weights when param is an fp32 master copy) receives the
// updated values cast to its dtype.
void adamw_step(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                torch::Tensor& exp_avg_sq, const AdamWOptions& options, torch::Tensor param_copy = {});

// torch.linalg.vector_norm(x, dtype=float64) ** 2: the unfused composition (an fp64 copy of x).
torch::Tensor squared_norm(const torch::Tensor& x);

}  // namespace tigon::reference
