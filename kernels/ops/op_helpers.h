// Small helpers the ops share: the CPU paths' accumulation type and the [rows, hidden] view of an input.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace tigon::ops {

// The CPU paths compute in fp32, or in float64 for float64 inputs (the tests' oracle precision).
inline torch::ScalarType AccumulateType(torch::ScalarType t) {
  return t == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// [rows, hidden] with unit stride over hidden: a view where the layout allows it, else a contiguous copy.
inline torch::Tensor AsRows(const torch::Tensor& t, int64_t hidden) {
  auto rows = t.reshape({-1, hidden});
  return rows.stride(1) == 1 ? rows : rows.contiguous();
}

}  // namespace tigon::ops
