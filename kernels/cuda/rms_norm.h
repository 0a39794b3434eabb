// RMSNorm and residual-add + RMSNorm over rows of [rows, hidden] (launchers; no CUDA or torch headers here).
//
// Forward, per row (with a residual: h = x + residual, written to residual_out, and normalised instead of x):
//   rstd  = 1 / sqrt(mean(h^2) + eps)            (fp32 accumulation; saved, fp32 [rows])
//   kLlama: y = round_W(offset + w) * round_T(h * rstd)     (Hugging Face LlamaRMSNorm)
//   kGemma: y = round_T((offset + w) * h * rstd)           (GemmaRMSNorm, all fp32)
//   kNone:  y = (offset + w) * h * rstd                    (fp32 inside, one rounding)
// Backward recomputes x_hat = h * rstd from h and the saved rstd; nothing else is saved:
//   g = dy * (offset + w);  dh = rstd * (g - x_hat * mean(g * x_hat))  (+ d_residual_out when given)
//   dweight = sum_rows dy * x_hat  (kLlama: x_hat rounded to the input type first, as Hugging Face does)
// dh is written (=). dweight is reduced in two stages, deterministically and without atomics: each block
// sums its rows into dweight_partials[block, :] (fp32), then a column-sum kernel writes dweight (=).
// Rows have unit stride inside and any row stride between them; offsets are 64-bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

// Where the norm rounds (the formulas above); the ops map tigon::RMSNormCasting onto it.
enum class RMSNormCasting : int32_t { kLlama = 0, kGemma = 1, kNone = 2 };

struct RMSNormForwardParams {
  const void* x = nullptr;         // [rows, hidden]
  int64_t x_row_stride = 0;        // in elements
  const void* residual = nullptr;  // [rows, hidden] or null (plain RMSNorm); same dtype as x
  int64_t residual_row_stride = 0;
  void* residual_out = nullptr;  // [rows, hidden] x + residual (dtype of x); required with residual
  int64_t residual_out_row_stride = 0;
  const void* weight = nullptr;  // [hidden], contiguous
  void* y = nullptr;             // [rows, hidden]
  int64_t y_row_stride = 0;
  float* rstd = nullptr;  // [rows]
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
  float offset = 0.f;
  RMSNormCasting casting = RMSNormCasting::kLlama;
  DType x_dtype = DType::kFloat32;       // x, residual, residual_out
  DType weight_dtype = DType::kFloat32;  // equal to x_dtype, or kFloat32
  DType y_dtype = DType::kFloat32;       // x_dtype, or kFloat32 when weight is fp32 (type promotion)
};

struct RMSNormBackwardParams {
  const void* dy = nullptr;  // [rows, hidden], dtype y_dtype
  int64_t dy_row_stride = 0;
  const void* x = nullptr;  // the normalised input (residual_out for add + RMSNorm)
  int64_t x_row_stride = 0;
  const void* d_residual_out = nullptr;  // [rows, hidden] or null; added to dx (dtype of x)
  int64_t d_residual_out_row_stride = 0;
  const void* weight = nullptr;
  const float* rstd = nullptr;
  void* dx = nullptr;  // [rows, hidden], dtype of x
  int64_t dx_row_stride = 0;
  void* dweight = nullptr;            // [hidden], dtype of weight
  float* dweight_partials = nullptr;  // [rms_norm_backward_num_partials(rows), hidden] scratch
  int64_t rows = 0;
  int64_t hidden = 0;
  float offset = 0.f;
  RMSNormCasting casting = RMSNormCasting::kLlama;
  DType x_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  DType dy_dtype = DType::kFloat32;
};

LaunchStatus rms_norm_forward(const RMSNormForwardParams& params, void* stream);
LaunchStatus rms_norm_backward(const RMSNormBackwardParams& params, void* stream);

// Rows of dweight_partials the backward needs (one per backward block) on the current device.
int64_t rms_norm_backward_num_partials(int64_t rows);

}  // namespace tigon::cuda
