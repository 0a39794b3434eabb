// Device memory statistics from the caching allocator, per device. CPU devices report zeros.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace tigon::engine {

struct MemoryStats {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
};

void ResetPeakMemory(const torch::Device& device);
MemoryStats ReadMemory(const torch::Device& device);  // zeros on the CPU, and before torch has used CUDA
// What a new session could still allocate on `device`: on CUDA the driver's free memory plus the blocks
// this process's caching allocator holds unused; on the CPU the kernel's MemAvailable (cgroup's limit
// included), or less when the CPU tensor cap (tigon/cpu_memory_limit.h) leaves less room.
int64_t AvailableBytes(const torch::Device& device);
// A session's first member, so that its destructor runs after every tensor of the session is freed: gives
// the cached blocks back to the driver (CUDA) and the freed heap to the kernel (CPU, malloc_trim), so that a
// closed session's memory is free for other processes, not held by this one's allocators (two closed 1B
// sessions left 38 GiB reserved on an H200). Blocks other sessions use are untouched.
class ReleaseMemoryOnDestruction {
 public:
  explicit ReleaseMemoryOnDestruction(torch::Device device) : device_(device) {}
  ReleaseMemoryOnDestruction(const ReleaseMemoryOnDestruction&) = delete;
  ReleaseMemoryOnDestruction& operator=(const ReleaseMemoryOnDestruction&) = delete;
  ~ReleaseMemoryOnDestruction();

 private:
  torch::Device device_;
};

// Returns cached blocks to the driver (CUDA), or the C heap's free memory to the kernel (CPU): after an
// out-of-memory failure, so the next step starts clean and failures do not grow the process.
void ReleaseCachedMemory(const torch::Device& device);
// Runs one small matmul forward and backward on `device` in `dtype`, so that the cuBLAS handles of this
// thread and of autograd's backward thread, and their workspaces, exist before a large step fills the
// device: cuBLAS allocates them outside the caching allocator, and at the first matmul of a backward
// that left no memory free, creating them fails. No effect on the CPU.
void WarmUpMatmulLibraries(const torch::Device& device, torch::ScalarType dtype);
// True when `what` (an exception message) is a device out-of-memory error.
bool IsOutOfMemory(const std::string& what);

}  // namespace tigon::engine
