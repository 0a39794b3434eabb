// The one conversion of an exception thrown inside an engine call into the Status the call returns.
#pragma once

#include <torch/types.h>

#include <exception>

#include "tigon/engine.h"

namespace tigon::engine {

// Out of memory (c10's error or any message that says so): kResourceExhausted, after the device's cached
// blocks are returned to the driver (callers whose replicas may wait for this one in a collective release
// them first: see data_parallel_session.cpp). A model error or std::invalid_argument: kInvalidArgument.
// Anything else: kInternal. c10 errors lose their C++ backtrace; `call` names the engine call.
Status StatusFromException(const std::exception& e, const torch::Device& device, const char* call);

}  // namespace tigon::engine
