// The engine entry points the service uses, as values, so that tests can run the whole service
// against a fake engine and `main` against the real one (engine_api.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon::server {

struct EngineApi {
  std::function<tigon::Status(const tigon::SessionOptions&, std::unique_ptr<tigon::Session>*)> create_session;
  std::function<std::vector<tigon::DeviceInfo>()> list_devices;
  std::vector<std::string> model_families;
  std::string engine_version;
};

// tigon::CreateSession, tigon::ListDevices, ... from libtigon_engine.
EngineApi RealEngineApi();

}  // namespace tigon::server
