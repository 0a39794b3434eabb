// LayerNorm over rows of [rows, hidden] (launchers; no CUDA or torch headers here).
//
// Forward, per row: mean = mean(x), rstd = 1 / sqrt(mean((x - mean)^2) + eps) (fp32, two passes over the
// row held in registers), y = (x - mean) * rstd * w + b. Saved: mean and rstd (fp32 [rows]).
// Backward recomputes x_hat = (x - mean) * rstd:
//   g = dy * w;  dx = rstd * (g - x_hat * mean(g * x_hat) - mean(g))        (=)
//   dweight = sum_rows dy * x_hat, dbias = sum_rows dy, reduced in two stages without atomics: per-block
//   partial sums into dweight_partials / dbias_partials [blocks, hidden] (fp32), then column sums (=).
// Rows have unit stride inside and any row stride between them; offsets are 64-bit. Output dtype = x's.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

struct LayerNormForwardParams {
  const void* x = nullptr;  // [rows, hidden]
  int64_t x_row_stride = 0;
  const void* weight = nullptr;  // [hidden]
  const void* bias = nullptr;    // [hidden] or null; dtype of weight
  void* y = nullptr;             // [rows, hidden], dtype of x
  int64_t y_row_stride = 0;
  float* mean = nullptr;  // [rows]
  float* rstd = nullptr;  // [rows]
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-5f;
  DType x_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;  // equal to x_dtype, or kFloat32
};

struct LayerNormBackwardParams {
  const void* dy = nullptr;  // [rows, hidden], dtype of x
  int64_t dy_row_stride = 0;
  const void* x = nullptr;
  int64_t x_row_stride = 0;
  const void* weight = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  void* dx = nullptr;  // [rows, hidden], dtype of x
  int64_t dx_row_stride = 0;
  void* dweight = nullptr;            // [hidden], dtype of weight
  void* dbias = nullptr;              // [hidden] or null
  float* dweight_partials = nullptr;  // [layer_norm_backward_num_partials(rows), hidden] scratch
  float* dbias_partials = nullptr;    // same shape, or null when dbias is null
  int64_t rows = 0;
  int64_t hidden = 0;
  DType x_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
};

LaunchStatus layer_norm_forward(const LayerNormForwardParams& params, void* stream);
LaunchStatus layer_norm_backward(const LayerNormBackwardParams& params, void* stream);

int64_t layer_norm_backward_num_partials(int64_t rows);

}  // namespace tigon::cuda
