// Which calls the service still takes: all of them until shutdown begins, none after, while the calls
// already admitted run to their end and shutdown waits for them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tigon::server {

class CallGate {
 public:
  // True when the call is admitted (it must Leave); false once draining.
  bool Enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return false;
    ++in_flight_;
    return true;
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) done_.notify_all();
  }
  void BeginDrain() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  // True when no admitted call is left before `deadline`.
  bool WaitForCalls(std::chrono::system_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return done_.wait_until(lock, deadline, [this] { return in_flight_ == 0; });
  }
  int64_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable done_;
  int64_t in_flight_ = 0;  // guarded by mu_
  bool draining_ = false;  // guarded by mu_
};

}  // namespace tigon::server
