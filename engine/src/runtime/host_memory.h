// The host's memory as the kernel reports it, a container's cgroup v2 limit included: what the default CPU
// tensor cap is a share of, and what a CPU session's memory estimate is measured against.
#pragma once

#include <cstdint>

namespace tigon::engine {

// MemTotal, or the cgroup's memory.max when that is lower; 0 when neither can be read.
int64_t MachineMemoryBytes();
// MemAvailable, or the cgroup's room (memory.max - memory.current) when that is less; -1 when neither can
// be read.
int64_t HostAvailableBytes();

}  // namespace tigon::engine
