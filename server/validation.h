// Request checks that run before the engine sees a request, and the conversions from the wire types
// to the engine's. Every refusal says which field was wrong and why.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "server/engine_api.h"
#include "server/model_roots.h"
#include "tigon/engine.h"
#include "tigon/v1/trainer.pb.h"

namespace tigon::server {

// A batch is checked against the session's model and the server's limit by the engine's one batch
// contract (tigon::CheckBatch in engine.h, which says the rules): the same batch gets the same answer
// here, before any lock, as from the engine. RESOURCE_EXHAUSTED when batch * seq_len is over
// --max-batch-tokens; INVALID_ARGUMENT for everything else.
using BatchLimits = tigon::BatchLimits;
grpc::Status ValidateBatch(const v1::Batch& batch, const BatchLimits& limits);
// The part of ValidateBatch that needs only the shape: positive, within the limit and the model.
grpc::Status ValidateBatchShape(int64_t rows, int64_t seq_len, const BatchLimits& limits);

tigon::Batch ToEngineBatch(const v1::Batch& batch);

// A session id as CreateSession returns it: not empty, at most kMaxSessionIdBytes of letters, digits,
// '.', '_' and '-'. INVALID_ARGUMENT otherwise, before the id is looked up (or logged).
inline constexpr size_t kMaxSessionIdBytes = 64;
grpc::Status ValidateSessionId(const std::string& session_id);
// A request_id (the client's idempotency key; empty means none): at most kMaxRequestIdBytes.
inline constexpr size_t kMaxRequestIdBytes = 128;
grpc::Status ValidateRequestId(const std::string& request_id);

// The settings that are set, by the engine's rule (tigon::CheckOptimizerSettings).
grpc::Status ValidateOptimizerSettings(const v1::OptimizerSettings& settings);
tigon::OptimizerOverrides ToEngineOverrides(const v1::OptimizerSettings& settings);

// Checks a CreateSessionRequest against the engine's model families and the device count, and
// fills the engine's options. A model_path request needs `model_folder`, what ModelRoots::Resolve
// found for it (the folder and its config.json).
// max_parameters (--max-parameters) goes to the engine, which counts the model's parameters from its
// config and refuses a larger one, or one that does not fit its device, before allocating anything.
grpc::Status ValidateCreateSession(const v1::CreateSessionRequest& request,
                                   const std::vector<std::string>& model_families, int device_count,
                                   tigon::SessionOptions* options, int64_t max_parameters = 0,
                                   const ModelFolder* model_folder = nullptr);

// CreateSessionRequest.world, when set: world_size in [2, kMaxWorldSize], rank in [0, world_size), the
// 128-byte communicator id, a collective timeout in [0, a day], one CUDA device (devices empty means
// device 0), and not the optimizer in backward (whose update cannot wait for the other ranks'
// gradients). Fills `world` (world_size 0 when the request has no world). Call after
// ValidateCreateSession, which checked the device indices.
grpc::Status ValidateWorldRank(const v1::CreateSessionRequest& request, int device_count, WorldRank* world);
inline constexpr int kMaxWorldSize = 4096;
inline constexpr size_t kCommunicatorIdBytes = 128;  // NCCL's unique id
inline constexpr double kMaxCollectiveTimeoutSeconds = 86400.0;

}  // namespace tigon::server
