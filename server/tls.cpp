#include "server/tls.h"

#include <fstream>
#include <sstream>

namespace tigon::server {
namespace {

// The file's text, checked to hold a PEM block whose label contains `kind` ("CERTIFICATE", "PRIVATE KEY").
bool ReadPem(const std::string& path, const char* flag, const std::string& kind, std::string* out,
             std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = std::string("cannot read ") + flag + " '" + path + "'";
    return false;
  }
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  const size_t begin = out->find("-----BEGIN ");
  const size_t label_end = begin == std::string::npos ? std::string::npos : out->find("-----", begin + 11);
  if (label_end == std::string::npos || out->substr(begin, label_end - begin).find(kind) == std::string::npos) {
    *error = std::string(flag) + " '" + path + "' holds no PEM " + kind;
    return false;
  }
  return true;
}

}  // namespace

bool ReadTlsOptions(const ServerOptions& options, grpc::SslServerCredentialsOptions* out, std::string* error) {
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  if (!ReadPem(options.tls_cert, "--tls-cert", "CERTIFICATE", &pair.cert_chain, error)) return false;
  if (!ReadPem(options.tls_key, "--tls-key", "PRIVATE KEY", &pair.private_key, error)) return false;
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!options.tls_client_ca.empty()) {
    if (!ReadPem(options.tls_client_ca, "--tls-client-ca", "CERTIFICATE", &ssl.pem_root_certs, error)) return false;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  *out = std::move(ssl);
  return true;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerOptions& options, std::string* error) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  if (!ReadTlsOptions(options, &ssl, error)) return nullptr;
  return grpc::SslServerCredentials(ssl);
}

}  // namespace tigon::server
