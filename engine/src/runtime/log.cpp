#include "runtime/log.h"

#include <iostream>
#include <mutex>

namespace tigon {
namespace {
std::mutex& SinkMutex() {
  static std::mutex m;
  return m;
}
std::function<void(LogLevel, const std::string&)>& Sink() {
  static std::function<void(LogLevel, const std::string&)> sink;
  return sink;
}
const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}
}  // namespace

void SetLogSink(std::function<void(LogLevel, const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

namespace engine {
void Log(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level, message);
  } else if (level != LogLevel::kDebug) {
    std::cerr << "[tigon " << LevelName(level) << "] " << message << "\n";
  }
}
}  // namespace engine
}  // namespace tigon
