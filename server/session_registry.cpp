#include "server/session_registry.h"

#include <chrono>
#include <iomanip>
#include <sstream>

#include "server/client_text.h"
#include "server/validation.h"

namespace tigon::server {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SessionEntry::Touch() { last_used_ns = SteadyNowNs(); }

void SessionEntry::RefreshInfo() {
  Touch();  // idle time counts from the end of the last call
  tigon::SessionInfo fresh = session->Info();
  std::lock_guard<std::mutex> lock(info_mu);
  info = std::move(fresh);
}

SessionRegistry::SessionRegistry(int64_t max_sessions) : max_sessions_(max_sessions), id_rng_(std::random_device{}()) {}

std::shared_ptr<SessionEntry> SessionRegistry::Find(const std::string& session_id, const Caller& caller,
                                                    grpc::Status* status) const {
  *status = ValidateSessionId(session_id);  // an absurd id is refused before it is looked up or logged
  if (!status->ok()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    *status = grpc::Status(grpc::StatusCode::NOT_FOUND, "no session '" + ClientText(session_id) + "' on this server");
    return nullptr;
  }
  if (!MayUseSession(caller, it->second->owner)) {
    *status = grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                           "session '" + ClientText(session_id) + "' belongs to another client; its calls need the token of the "
                           "client that created it or an admin token");
    return nullptr;
  }
  return it->second;
}

SessionRegistry::Slot::~Slot() {
  if (registry_ == nullptr) return;
  std::lock_guard<std::mutex> lock(registry_->mu_);
  --registry_->being_created_;
}

grpc::Status SessionRegistry::Reserve(Slot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t in_use = static_cast<int64_t>(sessions_.size()) + being_created_;
  if (in_use >= max_sessions_) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "server limit: " + std::to_string(in_use) +
                            " sessions are open or being created, the most this server allows (--max-sessions=" +
                            std::to_string(max_sessions_) + "); close a session first");
  }
  ++being_created_;
  slot->registry_ = this;
  return grpc::Status::OK;
}

std::string SessionRegistry::NewSessionId() {
  for (;;) {
    std::ostringstream out;
    out << "s-" << std::hex << std::setw(16) << std::setfill('0') << id_rng_();
    if (sessions_.count(out.str()) == 0) return out.str();
  }
}

bool SessionRegistry::Add(const std::shared_ptr<SessionEntry>& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entry->id.empty()) {
    entry->id = NewSessionId();
  } else if (sessions_.count(entry->id) != 0) {
    return false;
  }
  sessions_[entry->id] = entry;
  return true;
}

bool SessionRegistry::Remove(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.erase(session_id) > 0;
}

std::vector<std::shared_ptr<SessionEntry>> SessionRegistry::VisibleTo(const Caller& caller) const {
  std::vector<std::shared_ptr<SessionEntry>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, entry] : sessions_) {
    if (MayUseSession(caller, entry->owner)) out.push_back(entry);  // a user sees only its own
  }
  return out;
}

std::vector<std::shared_ptr<SessionEntry>> SessionRegistry::IdleLongerThan(int64_t idle_ns) const {
  std::vector<std::shared_ptr<SessionEntry>> out;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = SteadyNowNs();
  for (const auto& [id, entry] : sessions_) {
    if (now - entry->last_used_ns.load() > idle_ns) out.push_back(entry);
  }
  return out;
}

std::map<std::string, std::shared_ptr<SessionEntry>> SessionRegistry::TakeAll() {
  std::map<std::string, std::shared_ptr<SessionEntry>> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(sessions_);
  return out;
}

int64_t SessionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}

}  // namespace tigon::server
