#include "runtime/device_memory.h"

#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <limits>

#include "runtime/host_memory.h"
#include "tigon/cpu_memory_limit.h"

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
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
  // Before torch's first CUDA allocation its allocator has no statistics (asking fails with "Invalid device
  // argument") and holds nothing: zeros.
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  if (device.is_cuda() && allocator != nullptr && allocator->initialized()) {
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

int64_t AvailableBytes(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device.index());
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::numeric_limits<int64_t>::max();  // unknown: the allocation itself will say
    }
    const MemoryStats stats = ReadMemory(device);
    return static_cast<int64_t>(free) + std::max<int64_t>(0, stats.reserved - stats.allocated);
  }
#endif
  int64_t available = HostAvailableBytes();
  if (available < 0) available = std::numeric_limits<int64_t>::max();  // unknown: the allocation itself will say
  const CpuMemoryUsage cap = GetCpuMemoryUsage();
  if (cap.installed && cap.limit_bytes > 0) {
    available = std::min(available, std::max<int64_t>(0, cap.limit_bytes - cap.in_use_bytes));
  }
  return available;
}

ReleaseMemoryOnDestruction::~ReleaseMemoryOnDestruction() {
  ReleaseCachedMemory(device_);
  if (device_.is_cuda()) malloc_trim(0);  // the host memory of loading and checkpoints
}

void ReleaseCachedMemory(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    return;
  }
#endif
  (void)device;
  // The CPU's cache is the C heap: the blocks of a failed step's tensors, freed, stay with the process
  // (tens of MB after a hundred failures) unless they are given back.
  malloc_trim(0);
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
