// Test support: hooks that tests use to force failures inside the engine. Not part of the engine's
// contract (engine/include/tigon/): the server and other production callers neither include this header nor
// link its target; tests get it through the tigon_engine_testing CMake target. No torch types (the engine
// tests see engine.h only).
#pragma once

#include <functional>
#include <string>

#include "tigon/engine.h"

namespace tigon::testing {

// Called on each replica's thread at named points: "forward_backward", "bucket:<i>" before bucket i of the
// launch order starts, "optim_step". Throwing from it makes that replica fail there (a message naming
// "out of memory" is reported as RESOURCE_EXHAUSTED, as a real one would be).
using FaultInjector = std::function<void(int replica, const std::string& point)>;

// Installs `injector` (an empty one removes it) on a data-parallel session; false when `session` is not
// one. Call it between the session's calls, never during one.
bool SetFaultInjector(Session& session, FaultInjector injector);

}  // namespace tigon::testing
