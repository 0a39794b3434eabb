// What the ops need from CUDA LibTorch, behind a torch-version-neutral interface: the current stream of a
// device and the element type tag of a tensor. CurrentCudaStream throws on a LibTorch without CUDA.
#pragma once

#include <torch/types.h>

#include "kernels/cuda/dtype.h"

namespace tigon::ops {

// The cudaStream_t (as void*) that torch is using on `device` now.
void* CurrentCudaStream(const torch::Device& device);

// kFloat32 / kBFloat16 / kFloat16; throws a readable error for any other dtype.
cuda::DType CudaDType(const torch::Tensor& t);

// Throws with the launcher's CUDA error text when `status` is not success.
void CheckLaunch(cuda::LaunchStatus status, const char* what);

}  // namespace tigon::ops
