// Test support: hooks that tests and fault drills use to force failures inside the engine. Not part of the
// engine's contract (engine/include/tigon/): the server and other production callers neither include nor
// link against this header's target; tests get it through the tigon_engine_testing CMake target. No torch
// types (the engine tests see engine.h only).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tigon/engine.h"

namespace tigon::testing {

// ---- failures inside a data-parallel step ---------------------------------------------------------

// Called on each replica's thread at named points: "forward_backward", "bucket:<i>" before bucket i of the
// launch order starts, "optim_step". Throwing from it makes that replica fail there (a message naming
// "out of memory" is reported as RESOURCE_EXHAUSTED, as a real one would be).
using FaultInjector = std::function<void(int replica, const std::string& point)>;

// Installs `injector` (an empty one removes it) on a data-parallel session; false when `session` is not
// one. Call it between the session's calls, never during one.
bool SetFaultInjector(Session& session, FaultInjector injector);

// ---- CPU out of memory -----------------------------------------------------------------------------
//
// A cap on the CPU memory that tensors hold, so that running out of memory on the CPU can be forced and
// tested the way it happens on a GPU: an allocation past the cap fails with torch's out-of-memory error,
// the step reports RESOURCE_EXHAUSTED and the session keeps its state. A process that loads
// libtigon_engine (the server in the integration tests) reads TIGON_CPU_MEMORY_LIMIT_BYTES at start and
// installs the cap when it is set.

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

}  // namespace tigon::testing
