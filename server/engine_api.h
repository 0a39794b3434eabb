// The engine entry points the service uses, as values, so that tests can run the whole service
// against a fake engine and `main` against the real one (engine_api.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon::server {

// One rank of a data-parallel session spread over several servers (CreateSessionRequest.world).
struct WorldRank {
  int world_size = 0;  // 0: not part of a world
  int rank = 0;
  std::string communicator_id;
  double collective_timeout_seconds = 0.0;  // 0: the engine's default
};

struct EngineApi {
  std::function<tigon::Status(const tigon::SessionOptions&, std::unique_ptr<tigon::Session>*)> create_session;
  // A rank of a session spread over several servers; blocks until every rank has joined.
  std::function<tigon::Status(const tigon::SessionOptions&, const WorldRank&, std::unique_ptr<tigon::Session>*)>
      create_world_session;
  // A fresh communicator id for such a session (FAILED_PRECONDITION-like status where there is no NCCL).
  std::function<tigon::Status(std::string*)> new_communicator_id;
  std::function<std::vector<tigon::DeviceInfo>()> list_devices;
  std::vector<std::string> model_families;
  std::string engine_version;
};

// tigon::CreateSession, tigon::ListDevices, ... from libtigon_engine.
EngineApi RealEngineApi();

}  // namespace tigon::server
