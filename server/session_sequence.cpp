#include "server/session_sequence.h"

#include <algorithm>
#include <vector>

namespace tigon::server {

SessionSequence::Turn& SessionSequence::Turn::operator=(Turn&& other) noexcept {
  if (this != &other) {
    Release();
    sequence_ = other.sequence_;
    stream_ = std::move(other.stream_);
    number_ = other.number_;
    other.sequence_ = nullptr;
  }
  return *this;
}

void SessionSequence::Turn::Release() {
  if (sequence_ != nullptr) sequence_->Release(stream_, number_);
  sequence_ = nullptr;
}

void SessionSequence::Finish(Stream& stream, uint64_t number) {
  stream.done.insert(number);
  while (stream.done.erase(stream.next) > 0) stream.arrived.erase(stream.next++);
  changed_.notify_all();
}

void SessionSequence::Release(const std::string& name, uint64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(name);
  if (it == streams_.end()) return;
  Finish(it->second, number);
  --it->second.holders;
}

void SessionSequence::ForgetIdleStreams() {
  if (streams_.size() <= kMaxStreams) return;
  std::vector<std::pair<uint64_t, std::string>> idle;
  for (const auto& [name, stream] : streams_) {
    if (stream.holders == 0) idle.emplace_back(stream.last_used, name);
  }
  std::sort(idle.begin(), idle.end());
  for (size_t i = 0; i < idle.size() && streams_.size() > kMaxStreams; ++i) streams_.erase(idle[i].second);
}

grpc::Status SessionSequence::WaitForTurn(const std::string& name, uint64_t number, const Limits& limits,
                                          Turn* turn) {
  if (number == 0) return grpc::Status::OK;
  std::unique_lock<std::mutex> lock(mu_);
  const bool known = streams_.count(name) > 0;
  Stream& stream = streams_[name];
  // After a restart the calls numbered before it never come: a stream first seen then begins here.
  if (!known && streams_begin_at_first_call_) stream.next = number;
  stream.last_used = ++uses_;
  if (!stream.broken.empty()) return grpc::Status(grpc::StatusCode::ABORTED, stream.broken);
  if (number < stream.next || stream.arrived.count(number) > 0) return grpc::Status::OK;  // a retry
  stream.arrived.insert(number);
  ++stream.holders;
  ForgetIdleStreams();  // never this stream: it has a holder now

  const auto refuse = [&](grpc::StatusCode code, const std::string& message) {
    Finish(stream, number);
    --stream.holders;
    return grpc::Status(code, message);
  };
  uint64_t gap = 0;  // the lowest earlier number not here yet, and since when
  auto gap_since = std::chrono::steady_clock::now();
  while (stream.next != number) {
    if (!stream.broken.empty()) return refuse(grpc::StatusCode::ABORTED, stream.broken);
    uint64_t missing = stream.next;
    while (missing < number && stream.arrived.count(missing) > 0) ++missing;
    const auto now = std::chrono::steady_clock::now();
    if (missing == number) {
      gap = 0;
    } else if (missing != gap) {
      gap = missing;
      gap_since = now;
    } else if (now - gap_since >= std::chrono::duration<double>(limits.gap_timeout_seconds)) {
      const double seconds = limits.gap_timeout_seconds;
      stream.broken = "call " + std::to_string(gap) + " of this client's calls on the session never reached the "
                      "server (waited " + std::to_string(static_cast<int64_t>(seconds * 1000)) + " ms for it after "
                      "call " + std::to_string(number) + " came); so that none runs out of order, the calls sent "
                      "after it are refused and none was run";
      changed_.notify_all();
      return refuse(grpc::StatusCode::ABORTED, stream.broken);
    }
    if (std::chrono::system_clock::now() >= limits.deadline) {
      return refuse(grpc::StatusCode::DEADLINE_EXCEEDED,
                    "the deadline passed while the call waited for the calls sent before it; nothing was applied");
    }
    if (limits.cancelled && limits.cancelled()) {
      return refuse(grpc::StatusCode::CANCELLED,
                    "the call was cancelled while it waited for the calls sent before it; nothing was applied");
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));  // wakes early when a call finishes
  }
  turn->Release();
  turn->sequence_ = this;
  turn->stream_ = name;
  turn->number_ = number;
  return grpc::Status::OK;
}

}  // namespace tigon::server
