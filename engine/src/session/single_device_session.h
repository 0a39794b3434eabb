// The single-device session (session.cpp), built by CreateReplicaSession (create_session.cpp) from a
// model it has loaded or initialised, with the model folder's companion files (tokenizer, generation
// config) that every checkpoint of the session gets a copy of.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "parallel/replica.h"
#include "session/flat_parameters.h"
#include "tigon/engine.h"

namespace tigon::engine {

std::unique_ptr<ReplicaSession> MakeSingleDeviceSession(std::unique_ptr<models::DecoderModel> model,
                                                        Precision precision, torch::Device device,
                                                        std::vector<int> devices, const SessionOptions& options,
                                                        std::map<std::string, std::string> companion_files);

}  // namespace tigon::engine
