// Requests whose bytes do not parse as their protobuf message. gRPC's synchronous server parses a
// request before any handler runs and answers a failure with INTERNAL and an empty message; the
// handlers never see the call. This interceptor turns that answer into INVALID_ARGUMENT naming the
// method and the message type expected. gRPC hands over neither the bytes nor the parser's reason, so
// the message cannot say which field was wrong.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace tigon::server {

class ParseErrorInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;
};

// The interceptor creators a ServerBuilder takes (builder.experimental().SetInterceptorCreators).
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> RequestInterceptors();

}  // namespace tigon::server
