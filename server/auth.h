// Bearer-token authentication of Trainer calls (--auth-token-file) and the caller identities that
// per-session ownership is checked against.
#pragma once

#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <string>
#include <vector>

namespace tigon::server {

// Who made a call. A session belongs to the name of the caller that created it; `admin` callers may
// use every session. With authentication off every caller is the anonymous admin.
struct Caller {
  std::string name;
  bool admin = false;
};

// A token and the identity it stands for.
struct TokenEntry {
  std::string token;
  Caller caller;
};

class TokenAuthenticator {
 public:
  // The name shared by tokens listed without a role and name (the one-token-per-line format): they
  // are one user, so a client may switch between them (a rotation) and keep its sessions.
  static constexpr const char* kDefaultName = "default";

  TokenAuthenticator() = default;  // disabled: every call passes as the anonymous admin
  explicit TokenAuthenticator(std::vector<TokenEntry> entries) : entries_(std::move(entries)) {}
  // Bare tokens: each one the user kDefaultName.
  explicit TokenAuthenticator(const std::vector<std::string>& tokens);

  // One entry per line, fields separated by whitespace:
  //   TOKEN                  the user "default" (the original format: every such token is the same user)
  //   TOKEN ROLE NAME        ROLE is `user` or `admin`; NAME ([A-Za-z0-9._@-]+, not . or ..) owns the sessions
//                          it creates and the checkpoint namespace <checkpoint-root>/NAME
  // Blank lines and lines starting with '#' are ignored. Several tokens may share a name (a rotation).
  // No token, a repeated token, an unknown role or a malformed line is an error naming the line.
  static bool LoadFromFile(const std::string& path, TokenAuthenticator* out, std::string* error);
  // The same rules over text (the file's contents); `source` names it in errors.
  static bool Parse(const std::string& text, const std::string& source, TokenAuthenticator* out,
                    std::string* error);

  bool enabled() const { return !entries_.empty(); }
  size_t size() const { return entries_.size(); }
  size_t admin_count() const;

  // OK with the caller's identity, or UNAUTHENTICATED with a message that says whether the metadata
  // was missing, malformed or held a token that is not accepted (never the token itself).
  grpc::Status Authenticate(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata, Caller* caller) const;
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
    Caller ignored;
    return Authenticate(metadata, &ignored);
  }

 private:
  const TokenEntry* Find(const std::string& token) const;
  std::vector<TokenEntry> entries_;
};

// Whether `caller` may use a session created by `owner`: its creator or an admin.
inline bool MayUseSession(const Caller& caller, const std::string& owner) {
  return caller.admin || caller.name == owner;
}

}  // namespace tigon::server
