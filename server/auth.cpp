#include "server/auth.h"

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

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

bool ValidName(const std::string& name) {
  // A name is also a folder of the checkpoint root (checkpoint_paths.h): "." and ".." are not names.
  if (name.empty() || name == "." || name == "..") return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '@' && c != '-') return false;
  }
  return true;
}

}  // namespace

TokenAuthenticator::TokenAuthenticator(const std::vector<std::string>& tokens) {
  for (const auto& token : tokens) entries_.push_back({token, Caller{kDefaultName, false}});
}

size_t TokenAuthenticator::admin_count() const {
  size_t n = 0;
  for (const auto& entry : entries_) n += entry.caller.admin ? 1 : 0;
  return n;
}

bool TokenAuthenticator::Parse(const std::string& text, const std::string& source, TokenAuthenticator* out,
                               std::string* error) {
  std::vector<TokenEntry> entries;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string content = Trim(line);
    if (content.empty() || content[0] == '#') continue;
    const std::string where = source + " line " + std::to_string(number);
    for (char c : content) {
      if (!std::isprint(static_cast<unsigned char>(c)) && !std::isspace(static_cast<unsigned char>(c))) {
        *error = where + " has control characters";
        return false;
      }
    }
    std::istringstream fields(content);
    std::vector<std::string> parts;
    for (std::string field; fields >> field;) parts.push_back(field);
    TokenEntry entry;
    entry.token = parts[0];
    if (parts.size() == 1) {
      entry.caller = Caller{kDefaultName, false};
    } else if (parts.size() == 3) {
      if (parts[1] != "user" && parts[1] != "admin") {
        *error = where + ": the role '" + parts[1] + "' is not 'user' or 'admin'";
        return false;
      }
      if (!ValidName(parts[2])) {
        *error = where + ": the name '" + parts[2] + "' may hold only letters, digits and . _ @ - (and is not . or ..)";
        return false;
      }
      entry.caller = Caller{parts[2], parts[1] == "admin"};
    } else {
      *error = where + " has " + std::to_string(parts.size()) +
               " fields; expected 'TOKEN' or 'TOKEN ROLE NAME' (ROLE: user or admin)";
      return false;
    }
    if (!seen.insert(entry.token).second) {
      *error = where + " repeats a token listed earlier";
      return false;
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    *error = source + " holds no token";
    return false;
  }
  *out = TokenAuthenticator(std::move(entries));
  return true;
}

bool TokenAuthenticator::LoadFromFile(const std::string& path, TokenAuthenticator* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read the auth token file '" + path + "'";
    return false;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return Parse(text.str(), "the auth token file '" + path + "'", out, error);
}

const TokenEntry* TokenAuthenticator::Find(const std::string& token) const {
  // Every entry is compared (no early exit), for the same reason as ConstantTimeEquals.
  const TokenEntry* found = nullptr;
  for (const TokenEntry& entry : entries_) {
    if (ConstantTimeEquals(token, entry.token)) found = &entry;
  }
  return found;
}

grpc::Status TokenAuthenticator::Authenticate(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                              Caller* caller) const {
  if (!enabled()) {
    *caller = Caller{"", true};
    return grpc::Status::OK;
  }
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
    if (const TokenEntry* entry = Find(Trim(value.substr(kScheme.size())))) {
      *caller = entry->caller;
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not accepted");
}

}  // namespace tigon::server
