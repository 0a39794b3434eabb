// The order of the calls on one session. A client numbers the calls it sends on a session, 1, 2, 3, ...
// in a stream of its own (CallOrder in trainer.proto); a call runs only once every call numbered before
// it in its stream has finished, so calls sent without waiting for each other run in the order they were
// sent, even when a later, smaller one reaches the server first.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace tigon::server {

class SessionSequence {
 public:
  // A call's place in its stream while it runs: when it ends (on every path), the next number's turn
  // comes. Empty for calls that are not ordered.
  class Turn {
   public:
    Turn() = default;
    Turn(Turn&& other) noexcept { *this = std::move(other); }
    Turn& operator=(Turn&& other) noexcept;
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    ~Turn() { Release(); }

   private:
    friend class SessionSequence;
    void Release();
    SessionSequence* sequence_ = nullptr;
    std::string stream_;
    uint64_t number_ = 0;
  };

  struct Limits {
    std::chrono::system_clock::time_point deadline;  // the call's own
    std::function<bool()> cancelled;                 // polled while waiting
    // How long a call waits for an earlier number that has not reached the server at all.
    double gap_timeout_seconds = 30.0;
  };

  // Number 0: not ordered, OK at once. A number already finished or already here (a retry of a call that
  // reached the server) runs at once too: request ids keep a retried step from being applied twice.
  // Otherwise waits for its turn. Refusals: DEADLINE_EXCEEDED / CANCELLED while waiting; ABORTED when an
  // earlier number has not arrived within the gap timeout, after which the stream refuses every call
  // (ABORTED), so that none runs out of order; the client then starts a new stream.
  grpc::Status WaitForTurn(const std::string& stream, uint64_t number, const Limits& limits, Turn* turn);

  // For a session resumed after a server restart (--resume-sessions): a stream first seen here starts at
  // the number of its first call, since the calls numbered before it went to the server that stopped.
  void BeginStreamsAtFirstCall() {
    std::lock_guard<std::mutex> lock(mu_);
    streams_begin_at_first_call_ = true;
  }

  // Streams kept per session; the least recently used idle ones beyond this are forgotten.
  static constexpr size_t kMaxStreams = 4096;

 private:
  struct Stream {
    uint64_t next = 1;             // the lowest number that has not finished
    std::set<uint64_t> arrived;    // numbers >= next that reached the server (waiting, running or done)
    std::set<uint64_t> done;       // numbers > next that finished before their turn (gave up waiting)
    std::string broken;            // set: why the stream takes no more calls
    int64_t holders = 0;           // calls waiting for or holding a turn
    uint64_t last_used = 0;
  };
  void Finish(Stream& stream, uint64_t number);  // under mu_
  void Release(const std::string& stream, uint64_t number);
  void ForgetIdleStreams();                      // under mu_

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Stream> streams_;  // guarded by mu_
  uint64_t uses_ = 0;                      // guarded by mu_
  bool streams_begin_at_first_call_ = false;  // guarded by mu_
};

}  // namespace tigon::server
