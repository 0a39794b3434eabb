// The fused ops (namespace tigon::ops). Each one is an autograd function: CUDA tensors go to the launchers
// in kernels/cuda, CPU tensors run the same fused math in C++ (same saved statistics, same recomputation).
// tigon::reference (kernels/reference/reference.h) has the same signatures with Hugging Face's unfused
// compositions.
#pragma once

#include <torch/types.h>

#include <tuple>
#include <vector>

#include "kernels/ops/common.h"

namespace tigon::ops {

// y = x * rsqrt(mean(x^2) + eps) * (offset + weight); x [..., H], weight [H]. Saves the per-row rstd.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, double offset,
                       RMSNormCasting casting);

// residual_out = x + residual; y = rms_norm(residual_out). Returns (y, residual_out).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps, double offset,
                                                      RMSNormCasting casting);

// linear(rms_norm(h), weights[i], biases[i]) for 1 to 3 projections of the same norm (q/k/v, gate/up), as
// one node that saves h but not rms_norm(h), which backward recomputes: the projections' input does not
// stay alive from forward to backward. h = x, or h = x + residual when residual is defined, in which case
// h is returned after the projections (as add_rms_norm's residual_out). biases: empty, or one per weight
// (undefined for none).
std::vector<torch::Tensor> rms_norm_linears(const torch::Tensor& x, const torch::Tensor& residual,
                                            const torch::Tensor& weight, double eps, double offset,
                                            RMSNormCasting casting, const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases = {});

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

// swiglu's / geglu's backward without autograd, into da and db (contiguous, a's shape and dtype; dy: a's
// shape and dtype): the values their autograd backward returns. Either output may be dy, a or b itself (in
// place), so a caller that owns dy needs fresh memory for db only. h, when defined (same rules), also
// receives act(a) * b, equal to the forward's output bit for bit, from the same pass over a and b.
void swiglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                         const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h = torch::Tensor());
void geglu_backward_out(const torch::Tensor& dy, const torch::Tensor& a, const torch::Tensor& b,
                        const torch::Tensor& da, const torch::Tensor& db, const torch::Tensor& h = torch::Tensor());

// linear(swiglu(a, b) or geglu(a, b), weight, bias) as one autograd node that saves a, b and weight and
// recomputes the activation in backward (the gated MLP's down projection). bias may be undefined.
torch::Tensor glu_linear(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& weight,
                         const torch::Tensor& bias, bool gelu);

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
// updated values cast to its dtype. grad_square_partials (optional, kAdamWGradSquarePartials float64
// values on param's device) receives the raw gradient's sum of squares in fp64, split into partials that
// sum to it (every entry written; deterministic): the gradient norm without a second read of the gradient.
constexpr int64_t kAdamWGradSquarePartials = 2048;
void adamw_step(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                torch::Tensor& exp_avg_sq, const AdamWOptions& options, torch::Tensor param_copy = {},
                torch::Tensor grad_square_partials = {});

// sum(x^2) over every element, accumulated in fp64: a 0-dim float64 tensor on x's device (no autograd).
// Deterministic for a given length. The global gradient norm is sqrt(squared_norm(grads)).
torch::Tensor squared_norm(const torch::Tensor& x);

}  // namespace tigon::ops
