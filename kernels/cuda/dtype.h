// The element types the launchers accept and the error type they return. Plain C++ so that both the
// torch side (kernels/ops) and nvcc translation units can include it.
#pragma once

#include <cstdint>

namespace tigon::cuda {

enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// A launcher returns cudaSuccess (0) or the CUDA error of its launch, as an int so that this header needs
// no CUDA include.
using LaunchStatus = int;

}  // namespace tigon::cuda
