#include "runtime/exception_status.h"

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>
#include <system_error>

#include "checkpoint/atomic_dir.h"
#include "models/model.h"
#include "runtime/device_memory.h"

namespace tigon::engine {

Status StatusFromException(const std::exception& e, const torch::Device& device, const char* call) {
  // c10 errors carry a C++ backtrace in what(); users get the message alone.
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || IsOutOfMemory(what)) {
    ReleaseCachedMemory(device);
    const std::string memory = device.is_cpu() ? "CPU memory" : "device memory";
    return Status(StatusCode::kResourceExhausted,
                  memory + " exhausted on " + device.str() + " during " + call +
                      "; the step was not applied: " + what.substr(0, 400));
  }
  if (const auto* io = dynamic_cast<const std::system_error*>(&e)) {
    return Status(StatusCodeForErrno(io->code().value()), std::string(call) + " failed: " + what);
  }
  if (dynamic_cast<const models::ModelError*>(&e) != nullptr ||
      dynamic_cast<const std::invalid_argument*>(&e) != nullptr) {
    return Status(StatusCode::kInvalidArgument, what);
  }
  return Status(StatusCode::kInternal, std::string(call) + " failed: " + what.substr(0, 2000));
}

}  // namespace tigon::engine
