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
MemoryStats ReadMemory(const torch::Device& device);
// Returns cached blocks to the driver (after an out-of-memory failure, so the next step starts clean).
void ReleaseCachedMemory(const torch::Device& device);
// Runs one small matmul forward and backward on `device` in `dtype`, so that the cuBLAS handles of this
// thread and of autograd's backward thread, and their workspaces, exist before a large step fills the
// device: cuBLAS allocates them outside the caching allocator, and at the first matmul of a backward
// that left no memory free, creating them fails. No effect on the CPU.
void WarmUpMatmulLibraries(const torch::Device& device, torch::ScalarType dtype);
// True when `what` (an exception message) is a device out-of-memory error.
bool IsOutOfMemory(const std::string& what);

}  // namespace tigon::engine
