// Cross entropy on logits, one CUDA block per row (launchers; no CUDA or torch headers here).
//
// Forward, per row i with target t (after the optional softcap x <- c * tanh(x / c)):
//   lse  = log sum_j exp(x_j)                                  (online softmax: max and sum in one pass)
//   loss = w_i * [ (1 - eps) * (lse - x_t) + eps * (lse - mean_j x_j) + z * lse^2 ]
// Written in place during forward (second pass over the row), when `write_grad`:
//   logits[i, j] <- scale * w_i * [ (1 + 2 z lse) * softmax_j - eps / V - (1 - eps) * [j == t] ]
//                   * (softcap ? 1 - (x_j / c)^2 : 1)
// with scale = grad_scale / max(*n_valid, 1) when n_valid is given (mean reduction), else grad_scale.
// Rows whose target is ignore_index get loss 0 and a zero gradient row. A target outside [0, V) that is
// not ignore_index gives a NaN loss (no host synchronisation to report it).
// Saved: nothing; the gradient is the logits buffer itself. Offsets are 64-bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

struct CrossEntropyParams {
  void* logits = nullptr;                // [n_rows, vocab], last dim contiguous, rows `logits_row_stride` apart
  int64_t logits_row_stride = 0;         // in elements
  DType dtype = DType::kFloat32;         // of logits
  const int64_t* target = nullptr;       // [n_rows], contiguous
  const float* token_weights = nullptr;  // [n_rows] or null (all 1)
  const int64_t* n_valid = nullptr;      // device count of non-ignored targets (mean reduction) or null
  float* loss = nullptr;                 // [n_rows] per-row loss, fp32
  int64_t n_rows = 0;
  int64_t vocab = 0;
  int64_t ignore_index = -100;
  float label_smoothing = 0.f;
  float z_loss_scale = 0.f;
  float softcap = 0.f;  // > 0 enables softcapping
  float grad_scale = 1.f;
  bool write_grad = true;  // false: loss only, logits untouched
};

// Per-row loss, and (write_grad) the gradient in place of the logits. Asynchronous on `stream`.
LaunchStatus cross_entropy_forward(const CrossEntropyParams& params, void* stream);

}  // namespace tigon::cuda
