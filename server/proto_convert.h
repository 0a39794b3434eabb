// The engine's results as wire messages (the other direction, requests to engine types, is in
// validation.h next to the checks).
#pragma once

#include <string>

#include "server/engine_api.h"
#include "tigon/engine.h"
#include "tigon/v1/trainer.pb.h"

namespace tigon::server {

void ToProto(const tigon::StepStats& stats, v1::StepResult* out);
// A session's info under its id; `world` says which rank of a session over several servers it is.
void ToProto(const tigon::SessionInfo& info, const std::string& session_id, const WorldRank& world,
             v1::SessionInfo* out);

}  // namespace tigon::server
