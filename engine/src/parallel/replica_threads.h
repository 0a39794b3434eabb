// The data-parallel session's threads, one per replica and kept across calls, and the rows of a batch
// each replica takes.
#pragma once

#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tigon/engine.h"

namespace tigon::engine {

// One long-lived thread per replica. Creating and joining threads on every call cost time and gave LibTorch
// fresh thread-local state each step (cuBLAS handle windows, current streams). Run(count, fn) runs fn(r) for
// every r < count on replica r's thread with the caller's thread-local state (grad mode, a running
// profiler) and returns when all are done; calls are serialised. With fewer than two replicas everything
// runs on the calling thread.
class ReplicaThreads {
 public:
  explicit ReplicaThreads(int replicas) {
    if (replicas < 2) return;
    for (int r = 0; r < replicas; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~ReplicaThreads() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  // fn should not throw; if it does, the first exception is rethrown here once every replica is done.
  void Run(int count, const std::function<void(int)>& fn) {
    std::lock_guard<std::mutex> serial(run_mutex_);
    if (threads_.empty()) {
      for (int r = 0; r < count; ++r) fn(r);
      return;
    }
    const at::ThreadLocalState state;
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &fn;
    state_ = &state;
    count_ = std::min<int>(count, static_cast<int>(threads_.size()));
    remaining_ = count_;
    error_ = nullptr;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [this] { return remaining_ == 0; });
    job_ = nullptr;
    state_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void Loop(int r) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int)>* job = nullptr;
      const at::ThreadLocalState* state = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (r >= count_) continue;
        job = job_;
        state = state_;
      }
      std::exception_ptr error;
      try {
        at::ThreadLocalStateGuard guard(*state);
        (*job)(r);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one Run at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  const at::ThreadLocalState* state_ = nullptr;
  int count_ = 0;
  int remaining_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Rows [first, first + count) of `batch`.
inline Batch SliceRows(const Batch& batch, int64_t first, int64_t count) {
  Batch out;
  out.batch = count;
  out.seq_len = batch.seq_len;
  const int64_t begin = first * batch.seq_len, end = (first + count) * batch.seq_len;
  out.input_ids.assign(batch.input_ids.begin() + begin, batch.input_ids.begin() + end);
  if (!batch.labels.empty()) out.labels.assign(batch.labels.begin() + begin, batch.labels.begin() + end);
  auto slice = [&](const std::vector<float>& from, std::vector<float>* to) {
    if (!from.empty()) to->assign(from.begin() + begin, from.begin() + end);
  };
  slice(batch.loss_weights, &out.loss_weights);
  slice(batch.sampler_logprobs, &out.sampler_logprobs);
  slice(batch.advantages, &out.advantages);
  slice(batch.reference_logprobs, &out.reference_logprobs);
  if (!batch.desirable.empty())
    out.desirable.assign(batch.desirable.begin() + first, batch.desirable.begin() + first + count);
  out.loss_fn = batch.loss_fn;
  out.loss_config = batch.loss_config;
  return out;
}

// Rows per replica: as even as possible, the first replicas taking one more.
inline std::vector<int64_t> SplitRows(int64_t rows, int replicas) {
  std::vector<int64_t> counts(replicas, rows / replicas);
  for (int64_t r = 0; r < rows % replicas; ++r) counts[r] += 1;
  return counts;
}

}  // namespace tigon::engine
