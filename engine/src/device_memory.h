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
// True when `what` (an exception message) is a device out-of-memory error.
bool IsOutOfMemory(const std::string& what);

}  // namespace tigon::engine
