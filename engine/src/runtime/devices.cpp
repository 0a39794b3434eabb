#include <torch/cuda.h>

#include "tigon/engine.h"

#include "runtime/device_memory.h"

#ifdef TIGON_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tigon {

std::vector<DeviceInfo> ListDevices() {
  std::vector<DeviceInfo> out;
#ifdef TIGON_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    int previous = 0;
    size_t free_bytes = 0, total = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(i) == cudaSuccess &&
        cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) {
      info.free_bytes = static_cast<int64_t>(free_bytes);
    }
    cudaSetDevice(previous);
    const engine::MemoryStats memory = engine::ReadMemory(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)));
    info.allocated_bytes = memory.allocated;
    info.reserved_bytes = memory.reserved;
    out.push_back(info);
  }
#endif
  return out;
}

}  // namespace tigon
