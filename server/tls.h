// TLS and mutual TLS for the gRPC port (--tls-cert, --tls-key, --tls-client-ca).
#pragma once

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "server/options.h"

namespace tigon::server {

// Reads the PEM files named by the options into gRPC's SSL options: the server's key and certificate
// chain, and with --tls-client-ca the client CA with client certificates required and verified (a
// client without one, or with one from another CA, fails the handshake). False with the reason in
// `error` for a file that cannot be read or holds no PEM block of the expected kind.
bool ReadTlsOptions(const ServerOptions& options, grpc::SslServerCredentialsOptions* out, std::string* error);

// Insecure credentials without --tls-cert, SSL credentials from ReadTlsOptions otherwise (null on error).
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerOptions& options, std::string* error);

}  // namespace tigon::server
