// The engine's wall-clock for step timings.
#pragma once

#include <chrono>

namespace tigon::engine {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace tigon::engine
