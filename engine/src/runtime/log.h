// The engine's logging: a process-wide sink the server points at spdlog (engine.h: SetLogSink).
#pragma once

#include <sstream>
#include <string>

#include "tigon/engine.h"

namespace tigon::engine {

void Log(LogLevel level, const std::string& message);

template <typename... Args>
void Logf(LogLevel level, const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  Log(level, out.str());
}

}  // namespace tigon::engine
