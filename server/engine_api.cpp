#include "server/engine_api.h"

#include "tigon/data_parallel.h"

namespace tigon::server {

EngineApi RealEngineApi() {
  EngineApi api;
  api.create_session = [](const tigon::SessionOptions& options, std::unique_ptr<tigon::Session>* session) {
    return tigon::CreateSession(options, session);
  };
  api.create_world_session = [](const tigon::SessionOptions& options, const WorldRank& world,
                                 std::unique_ptr<tigon::Session>* session) {
    tigon::DataParallelOptions parallel;
    parallel.world_size = world.world_size;
    parallel.rank = world.rank;
    parallel.nccl_unique_id = world.communicator_id;
    if (world.collective_timeout_seconds > 0) parallel.collective_timeout_seconds = world.collective_timeout_seconds;
    return tigon::CreateDataParallelSession(options, parallel, session);
  };
  api.new_communicator_id = [](std::string* id) { return tigon::NewNcclUniqueId(id); };
  api.list_devices = [] { return tigon::ListDevices(); };
  api.model_families = tigon::SupportedModelFamilies();
  api.engine_version = tigon::EngineVersion();
  return api;
}

}  // namespace tigon::server
