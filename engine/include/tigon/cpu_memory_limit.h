// A cap on the CPU memory that tensors hold, so that running out of memory on the CPU can be forced and
// tested the way it happens on a GPU: an allocation past the cap fails with torch's out-of-memory error,
// the step reports RESOURCE_EXHAUSTED and the session keeps its state.
//
// Any process that loads libtigon_engine (the server, tigon-train) installs the cap when the library
// loads: TIGON_CPU_MEMORY_LIMIT_BYTES when it is set (0: no cap), else kDefaultCpuMemoryShare of the
// machine's memory (MemTotal, or a container's cgroup limit when lower), so that running out of CPU
// memory is one session's RESOURCE_EXHAUSTED, not the OOM killer ending every session. No torch types
// here (engine.h's rule).
#pragma once

#include <cstdint>

namespace tigon {

inline constexpr double kDefaultCpuMemoryShare = 0.8;

// Sets the cap to `bytes` (0 lifts it). The first call installs a CPU allocator that wraps torch's and
// counts the bytes of every CPU tensor allocated from then on; it stays installed for the life of the
// process. Thread-safe. Throws std::invalid_argument for a negative value.
void SetCpuMemoryLimit(int64_t bytes);

struct CpuMemoryUsage {
  int64_t limit_bytes = 0;   // 0: no cap
  int64_t in_use_bytes = 0;  // CPU tensor memory allocated since the allocator was installed, not freed
  int64_t peak_bytes = 0;    // most in use at once since the last ResetCpuMemoryPeak
  int64_t refused = 0;       // allocations refused for the cap
  bool installed = false;
};

CpuMemoryUsage GetCpuMemoryUsage();
void ResetCpuMemoryPeak();

}  // namespace tigon
