// --tls-cert/--tls-key/--tls-client-ca read into gRPC's SSL options (the handshakes themselves are
// exercised end to end by tests/integration/test_security.py with certificates made by openssl).
#include "server/tls.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <unistd.h>

namespace tigon::server {
namespace {

// The process id keeps tests that ctest runs side by side (one process each) off each other's files.
std::string Write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "tigon_tls_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kCert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const char* kKey = "-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n";

TEST(Tls, ServerCertificateWithoutClientCa) {
  ServerOptions options;
  options.tls_cert = Write("cert.pem", kCert);
  options.tls_key = Write("key.pem", kKey);
  grpc::SslServerCredentialsOptions ssl;
  std::string error;
  ASSERT_TRUE(ReadTlsOptions(options, &ssl, &error)) << error;
  ASSERT_EQ(ssl.pem_key_cert_pairs.size(), 1u);
  EXPECT_EQ(ssl.pem_key_cert_pairs[0].cert_chain, kCert);
  EXPECT_EQ(ssl.pem_key_cert_pairs[0].private_key, kKey);
  EXPECT_TRUE(ssl.pem_root_certs.empty());
  EXPECT_EQ(ssl.client_certificate_request, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  EXPECT_NE(MakeServerCredentials(options, &error), nullptr);
}

TEST(Tls, ClientCaMeansClientCertificatesAreRequiredAndVerified) {
  ServerOptions options;
  options.tls_cert = Write("cert.pem", kCert);
  options.tls_key = Write("key.pem", kKey);
  options.tls_client_ca = Write("ca.pem", kCert);
  grpc::SslServerCredentialsOptions ssl;
  std::string error;
  ASSERT_TRUE(ReadTlsOptions(options, &ssl, &error)) << error;
  EXPECT_EQ(ssl.pem_root_certs, kCert);
  EXPECT_EQ(ssl.client_certificate_request, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
}

TEST(Tls, MissingOrWrongFilesAreErrorsNamingTheFlag) {
  ServerOptions options;
  options.tls_cert = Write("cert.pem", kCert);
  options.tls_key = Write("key.pem", kKey);
  std::string error;
  grpc::SslServerCredentialsOptions ssl;

  ServerOptions missing = options;
  missing.tls_key = testing::TempDir() + "tigon_tls_no_such_file";
  EXPECT_FALSE(ReadTlsOptions(missing, &ssl, &error));
  EXPECT_NE(error.find("cannot read --tls-key"), std::string::npos) << error;

  ServerOptions swapped = options;
  std::swap(swapped.tls_cert, swapped.tls_key);
  EXPECT_FALSE(ReadTlsOptions(swapped, &ssl, &error));
  EXPECT_NE(error.find("--tls-cert"), std::string::npos) << error;
  EXPECT_NE(error.find("no PEM CERTIFICATE"), std::string::npos) << error;

  ServerOptions not_pem = options;
  not_pem.tls_client_ca = Write("ca.txt", "just text\n");
  EXPECT_FALSE(ReadTlsOptions(not_pem, &ssl, &error));
  EXPECT_NE(error.find("--tls-client-ca"), std::string::npos) << error;
  EXPECT_EQ(MakeServerCredentials(not_pem, &error), nullptr);

  EXPECT_NE(MakeServerCredentials(ServerOptions(), &error), nullptr) << "no TLS flags: plaintext credentials";
}

}  // namespace
}  // namespace tigon::server
