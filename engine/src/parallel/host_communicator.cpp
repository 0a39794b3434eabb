// The host communicator: ranks are threads of this process. The last rank to arrive at a collective sums
// every rank's buffer in rank order (fp32 accumulation, one rounding for bf16) and writes the result into
// all of them, so results are deterministic and bit-identical across ranks.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "parallel/communicator.h"

namespace tigon::engine {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

class HostGroup;

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(HostGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  Status AllReduceValues(double* values, int count) override;
  Status StartAllReduce(void* data, int64_t count, ReduceDtype dtype, void* stream) override;
  void MarkBackwardEnd(void* /*stream*/) override { backward_end_ = Clock::now(); }
  Status Finish(void* stream) override;
  CommTimings LastTimings() const override { return last_; }

 private:
  HostGroup* group_;
  int rank_;
  CommTimings current_, last_;
  Clock::time_point backward_end_ = Clock::now();
};

class HostGroup final : public CommunicatorGroup {
 public:
  HostGroup(int size, double timeout_seconds) : timeout_seconds_(timeout_seconds), slots_(size) {
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<HostCommunicator>(this, r));
  }
  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r) override { return *ranks_.at(r); }
  std::string name() const override { return "host"; }

  void Abort(int failed_rank, const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    AbortLocked(failed_rank, reason, StatusCode::kUnavailable);
  }

  bool aborted() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_;
  }

  Status abort_status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_ ? abort_status_ : Status::Ok();
  }

  Status Reset() override {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = false;
    abort_status_ = Status();
    arrived_ = 0;
    ++generation_;
    return Status::Ok();
  }

  Status AllReduce(int rank, void* data, int64_t count, ReduceDtype dtype) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_) return abort_status_;
    slots_[rank] = {data, count, dtype};
    const uint64_t generation = generation_;
    if (++arrived_ == size()) {
      for (const auto& slot : slots_) {
        if (slot.count != count || slot.dtype != dtype) {
          AbortLocked(rank,
                      "ranks started different collectives (element counts " + std::to_string(slot.count) + " and " +
                          std::to_string(count) + ")",
                      StatusCode::kInternal);
          return abort_status_;
        }
      }
      Sum(count, dtype);
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return Status::Ok();
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_seconds_));
    while (generation_ == generation && !aborted_) {
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation && !aborted_) {
        AbortLocked(rank,
                    "timed out: waited " + std::to_string(timeout_seconds_) +
                        " s for the other ranks to join an all-reduce",
                    StatusCode::kDeadlineExceeded);
      }
    }
    if (generation_ != generation) return Status::Ok();  // the sum completed before any abort
    return abort_status_;
  }

 private:
  struct Slot {
    void* data = nullptr;
    int64_t count = 0;
    ReduceDtype dtype = ReduceDtype::kFloat32;
  };

  void AbortLocked(int failed_rank, const std::string& reason, StatusCode code) {
    if (!aborted_) {
      aborted_ = true;
      abort_status_ = Status(code,
                             "data-parallel step aborted: rank " + std::to_string(failed_rank) + " failed: " + reason);
    }
    changed_.notify_all();
  }

  void Sum(int64_t count, ReduceDtype dtype) {
    const int n = size();
    if (dtype == ReduceDtype::kFloat64) {
      for (int64_t i = 0; i < count; ++i) {
        double acc = static_cast<const double*>(slots_[0].data)[i];
        for (int r = 1; r < n; ++r) acc += static_cast<const double*>(slots_[r].data)[i];
        for (int r = 0; r < n; ++r) static_cast<double*>(slots_[r].data)[i] = acc;
      }
    } else if (dtype == ReduceDtype::kFloat32) {
      for (int64_t i = 0; i < count; ++i) {
        float acc = static_cast<const float*>(slots_[0].data)[i];
        for (int r = 1; r < n; ++r) acc += static_cast<const float*>(slots_[r].data)[i];
        for (int r = 0; r < n; ++r) static_cast<float*>(slots_[r].data)[i] = acc;
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        float acc = Bf16BitsToFloat(static_cast<const uint16_t*>(slots_[0].data)[i]);
        for (int r = 1; r < n; ++r) acc += Bf16BitsToFloat(static_cast<const uint16_t*>(slots_[r].data)[i]);
        const uint16_t bits = FloatToBf16Bits(acc);
        for (int r = 0; r < n; ++r) static_cast<uint16_t*>(slots_[r].data)[i] = bits;
      }
    }
  }

  double timeout_seconds_;
  std::vector<std::unique_ptr<HostCommunicator>> ranks_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  Status abort_status_;
};

int HostCommunicator::size() const { return group_->size(); }

Status HostCommunicator::AllReduceValues(double* values, int count) {
  return group_->AllReduce(rank_, values, count, ReduceDtype::kFloat64);
}

Status HostCommunicator::StartAllReduce(void* data, int64_t count, ReduceDtype dtype, void* /*stream*/) {
  const auto start = Clock::now();
  Status status = group_->AllReduce(rank_, data, count, dtype);
  current_.comm_ms += MsSince(start);
  current_.collectives += 1;
  current_.bytes += count * ReduceDtypeBytes(dtype);
  return status;
}

Status HostCommunicator::Finish(void* /*stream*/) {
  // Host sums are done when StartAllReduce returns; a group aborted since then still fails the step, so
  // that every rank reports the failure.
  current_.exposed_ms = MsSince(backward_end_);
  last_ = current_;
  current_ = CommTimings();
  return group_->abort_status();
}

}  // namespace

std::unique_ptr<CommunicatorGroup> MakeHostCommunicatorGroup(int size, double timeout_seconds) {
  return std::make_unique<HostGroup>(size, timeout_seconds);
}

}  // namespace tigon::engine
