// Shared by the CUDA kernels: dtype tags, vector loads, warp/block reductions, launch checks.
// CUDA headers only: nothing here knows about torch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dtype.h"
