// The engine's wall clock for step timings.
#pragma once

#include <chrono>

#include "tigon/engine.h"

namespace tigon::engine {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A call's wall time since `start` into its statistics, and the tokens per second that gives.
inline void StampWallTime(Clock::time_point start, StepStats* out) {
  out->wall_seconds = SecondsSince(start);
  out->tokens_per_second = out->wall_seconds > 0 ? out->tokens / out->wall_seconds : 0.0;
}

}  // namespace tigon::engine
