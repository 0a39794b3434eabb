// Bearer-token authentication of Trainer calls (--auth-token-file).
#pragma once

#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <string>
#include <vector>

namespace tigon::server {

class TokenAuthenticator {
 public:
  TokenAuthenticator() = default;  // disabled: every call passes
  explicit TokenAuthenticator(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  // One token per line; surrounding whitespace, blank lines and lines starting with '#' are ignored,
  // so a file may hold the current and the next token during a rotation. No token is an error.
  static bool LoadFromFile(const std::string& path, TokenAuthenticator* out, std::string* error);

  bool enabled() const { return !tokens_.empty(); }

  // OK, or UNAUTHENTICATED with a message that says whether the metadata was missing, malformed or
  // held a token that is not accepted (never the token itself).
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  bool Accepts(const std::string& token) const;
  std::vector<std::string> tokens_;
};

}  // namespace tigon::server
