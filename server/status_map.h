// The one mapping from the engine's status codes to gRPC's.
#pragma once

#include <grpcpp/support/status.h>

#include "tigon/engine.h"

namespace tigon::server {

grpc::StatusCode ToGrpcCode(tigon::StatusCode code);
grpc::Status ToGrpcStatus(const tigon::Status& status);

}  // namespace tigon::server

namespace tigon::server {

// "OK", "INVALID_ARGUMENT", ... as in the gRPC specification (used in logs and metric labels).
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace tigon::server
