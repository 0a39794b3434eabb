// The row kernel of cross entropy shared by the cross_entropy and fused_linear_cross_entropy ops: per-row
// losses and, optionally, the gradient written over the logits. CUDA tensors go to
// cuda::cross_entropy_forward, CPU tensors to the same online-softmax algorithm in C++.
#pragma once

#include <torch/types.h>

#include <string>

#include "kernels/ops/common.h"

namespace tigon::ops::detail {

// logits [n, V] with a contiguous last dim (rows may be strided); target [n] int64; token_weights [n] or
// undefined. Writes the per-row losses into loss_rows ([n], fp32, or fp64 for fp64 logits, contiguous).
// When write_grad, overwrites logits with d(sum_i loss_i * grad_scale / max(n_valid, 1)) / d logits, where
// n_valid is a 0-dim int64 tensor on logits' device (mean reduction) or undefined (not divided).
void CrossEntropyRows(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& token_weights,
                      const CrossEntropyOptions& options, const torch::Tensor& n_valid, double grad_scale,
                      bool write_grad, const torch::Tensor& loss_rows);

// Float type of the per-row losses for these logits.
torch::ScalarType LossDType(const torch::Tensor& logits);

// The reduction of the per-row losses: kMean divides by max(n_valid, 1).
torch::Tensor ReduceLoss(const torch::Tensor& loss_rows, const torch::Tensor& n_valid, Reduction reduction);

// The options from the torch.ops schemas' arguments; reduction: "mean" / "sum" / "none".
CrossEntropyOptions OptionsFromSchema(int64_t ignore_index, const std::string& reduction, double label_smoothing,
                                      double z_loss_scale, double softcap);

// Count of targets that are not ignore_index, as a 0-dim int64 tensor on target's device (no host sync).
torch::Tensor CountValid(const torch::Tensor& target, int64_t ignore_index);

}  // namespace tigon::ops::detail
