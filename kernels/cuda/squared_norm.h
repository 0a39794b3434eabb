// Sum of squares of a contiguous buffer, accumulated in fp64 (launcher; no CUDA or torch headers here).
// The global gradient norm of a training step: one read of the buffer instead of a converted copy per
// chunk. Deterministic: a fixed number of blocks (a function of n only) each writes one fp64 partial, and
// one block sums the partials in a fixed order.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.h"

namespace tigon::cuda {

// Partials the launcher needs for n elements (the caller allocates that many doubles on the device).
int64_t squared_norm_partials(int64_t n);

struct SquaredNormParams {
  const void* x = nullptr;
  DType dtype = DType::kFloat32;
  int64_t n = 0;
  double* partials = nullptr;  // squared_norm_partials(n) doubles of scratch
  double* out = nullptr;       // one double: receives sum(x^2)
};

LaunchStatus squared_norm(const SquaredNormParams& params, void* stream);

}  // namespace tigon::cuda
