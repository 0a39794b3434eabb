// The sessions a server holds: who owns each, the lock that serialises its engine calls, the results of
// its idempotent calls, and the places left under --max-sessions.
#pragma once

#include <grpcpp/support/status.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "server/auth.h"
#include "server/engine_api.h"
#include "server/request_cache.h"
#include "server/session_sequence.h"
#include "tigon/engine.h"

namespace tigon::server {

struct SessionEntry {
  std::string id;
  std::string owner;                        // the caller name that created it (fixed)
  std::timed_mutex step_mu;                 // held for every engine call on this session
  std::unique_ptr<tigon::Session> session;  // guarded by step_mu
  bool closed = false;                      // guarded by step_mu
  RequestCache request_cache;               // guarded by step_mu
  SessionSequence sequence;                 // the order of each client's numbered calls
  int64_t vocab_size = 0;                   // fixed at creation
  int64_t max_position_embeddings = 0;
  std::string model_family;
  tigon::SessionOptions options;         // as created (MeasureSavings builds temporary twins from it)
  WorldRank world;                       // world_size > 0: one rank of a session over several servers
  std::atomic<int64_t> last_used_ns{0};  // steady clock, at the last call on this session

  mutable std::mutex info_mu;
  tigon::SessionInfo info;  // guarded by info_mu; refreshed after every engine call

  // Under step_mu: the engine session is destroyed; later calls find the entry closed.
  void Close() {
    closed = true;
    session.reset();
  }
  // Refreshes `info` from the engine session (under step_mu) and marks the session used now.
  void RefreshInfo();
  tigon::SessionInfo InfoSnapshot() const {
    std::lock_guard<std::mutex> lock(info_mu);
    return info;
  }
  void Touch();
};

// Nanoseconds on the steady clock (what SessionEntry::last_used_ns holds).
int64_t SteadyNowNs();

class SessionRegistry {
 public:
  explicit SessionRegistry(int64_t max_sessions);

  // The session, if `session_id` names one (INVALID_ARGUMENT when empty, NOT_FOUND when unknown) and
  // `caller` may use it (PERMISSION_DENIED otherwise); null with `status` set when not.
  std::shared_ptr<SessionEntry> Find(const std::string& session_id, const Caller& caller, grpc::Status* status) const;

  // A place among --max-sessions for a session being created (RESOURCE_EXHAUSTED when full); the place
  // is given back when the Slot ends, whether or not a session was added meanwhile.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : registry_(other.registry_) { other.registry_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    ~Slot();

   private:
    friend class SessionRegistry;
    explicit Slot(SessionRegistry* registry) : registry_(registry) {}
    SessionRegistry* registry_ = nullptr;
  };
  grpc::Status Reserve(Slot* slot);

  // Adds a new session under a fresh id, which it writes into entry->id; or, when entry->id is set (a
  // session resumed after a restart), under that id, unless it is taken (false).
  bool Add(const std::shared_ptr<SessionEntry>& entry);
  // Removes the session from the registry (its entry lives on with those who hold it); false if absent.
  bool Remove(const std::string& session_id);
  // The sessions `caller` may use.
  std::vector<std::shared_ptr<SessionEntry>> VisibleTo(const Caller& caller) const;
  // The sessions without a call for longer than `idle_ns`.
  std::vector<std::shared_ptr<SessionEntry>> IdleLongerThan(int64_t idle_ns) const;
  // Removes every session and returns them (shutdown).
  std::map<std::string, std::shared_ptr<SessionEntry>> TakeAll();
  int64_t size() const;

 private:
  std::string NewSessionId();  // under mu_

  const int64_t max_sessions_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<SessionEntry>> sessions_;  // guarded by mu_
  int64_t being_created_ = 0;                                      // guarded by mu_
  std::mt19937_64 id_rng_;                                         // guarded by mu_
};

}  // namespace tigon::server
