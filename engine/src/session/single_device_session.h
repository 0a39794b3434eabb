// The single-device session (session.cpp), built by CreateReplicaSession (create_session.cpp) from a
// model it has loaded or initialised.
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

#include "models/model.h"
#include "parallel/replica.h"
#include "session/flat_parameters.h"
#include "tigon/engine.h"

namespace tigon::engine {

std::unique_ptr<ReplicaSession> MakeSingleDeviceSession(std::unique_ptr<models::DecoderModel> model,
                                                        Precision precision, torch::Device device,
                                                        std::vector<int> devices, const SessionOptions& options,
                                                        bool fused_adamw);

}  // namespace tigon::engine
