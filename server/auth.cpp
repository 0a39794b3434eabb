#include "server/auth.h"

#include <cctype>
#include <fstream>

namespace tigon::server {
namespace {

std::string Trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

// Compares without an early exit, so the time taken does not reveal how much of a token matched
// (the length may leak; it is not the secret part).
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool TokenAuthenticator::LoadFromFile(const std::string& path, TokenAuthenticator* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read the auth token file '" + path + "'";
    return false;
  }
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(in, line)) {
    std::string token = Trim(line);
    if (token.empty() || token[0] == '#') continue;
    for (char c : token) {
      if (std::isspace(static_cast<unsigned char>(c)) || !std::isprint(static_cast<unsigned char>(c))) {
        *error = "the auth token file '" + path + "' has a token with whitespace or control characters";
        return false;
      }
    }
    tokens.push_back(token);
  }
  if (tokens.empty()) {
    *error = "the auth token file '" + path + "' holds no token";
    return false;
  }
  *out = TokenAuthenticator(std::move(tokens));
  return true;
}

bool TokenAuthenticator::Accepts(const std::string& token) const {
  bool accepted = false;
  for (const std::string& candidate : tokens_) accepted |= ConstantTimeEquals(token, candidate);
  return accepted;
}

grpc::Status TokenAuthenticator::Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (!enabled()) return grpc::Status::OK;
  auto range = metadata.equal_range("authorization");
  if (range.first == range.second) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing 'authorization: Bearer <token>' metadata");
  }
  for (auto it = range.first; it != range.second; ++it) {
    std::string value(it->second.data(), it->second.size());
    static const std::string kScheme = "bearer ";
    if (value.size() <= kScheme.size()) continue;
    bool scheme_matches = true;
    for (size_t i = 0; i < kScheme.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) scheme_matches = false;
    }
    if (!scheme_matches) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the authorization metadata must be 'Bearer <token>'");
    }
    if (Accepts(Trim(value.substr(kScheme.size())))) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not accepted");
}

}  // namespace tigon::server
