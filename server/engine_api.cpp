#include "server/engine_api.h"

namespace tigon::server {

EngineApi RealEngineApi() {
  EngineApi api;
  api.create_session = [](const tigon::SessionOptions& options, std::unique_ptr<tigon::Session>* session) {
    return tigon::CreateSession(options, session);
  };
  api.list_devices = [] { return tigon::ListDevices(); };
  api.model_families = tigon::SupportedModelFamilies();
  api.engine_version = tigon::EngineVersion();
  return api;
}

}  // namespace tigon::server
