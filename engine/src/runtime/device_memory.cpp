#include "runtime/device_memory.h"

#include <torch/torch.h>

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tigon::engine {

void ResetPeakMemory(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

MemoryStats ReadMemory(const torch::Device& device) {
  MemoryStats out;
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // Index 0 is StatType::AGGREGATE (all pools) in every LibTorch version.
    out.allocated = stats.allocated_bytes[0].current;
    out.reserved = stats.reserved_bytes[0].current;
    out.peak_allocated = stats.allocated_bytes[0].peak;
    out.peak_reserved = stats.reserved_bytes[0].peak;
  }
#else
  (void)device;
#endif
  return out;
}

void ReleaseCachedMemory(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

void WarmUpMatmulLibraries(const torch::Device& device, torch::ScalarType dtype) {
  if (!device.is_cuda()) return;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  torch::Tensor a = torch::randn({64, 64}, options).requires_grad_(true);
  torch::Tensor b = torch::randn({64, 64}, options).requires_grad_(true);
  // mm backward runs two matmuls on autograd's device thread.
  torch::mm(a, b).sum().backward();
}

bool IsOutOfMemory(const std::string& what) {
  return what.find("out of memory") != std::string::npos ||
         what.find("OutOfMemory") != std::string::npos ||
         what.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
         what.find("not enough memory") != std::string::npos ||
         // Libraries that allocate for themselves when first used on a thread (cuBLAS handles and
         // workspaces, cuDNN plans), seen on a full H200 as the first matmul of backward.
         what.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos ||
         what.find("CUDNN_STATUS_ALLOC_FAILED") != std::string::npos;
}

}  // namespace tigon::engine
