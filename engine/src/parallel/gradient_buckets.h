// Buckets over a replica's flat gradient buffer, started as soon as backward has finished every gradient
// in them (engine/DATA_PARALLEL.md): a post-hook on each parameter's gradient accumulator counts the finished
// parameters of its bucket, and a bucket whose count reaches zero is launched — in a fixed launch order, so
// that every replica starts the same collectives in the same sequence.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "models/model.h"
#include "session/flat_parameters.h"

namespace torch::autograd {
struct Node;
}

namespace tigon::engine {

struct GradientBucket {
  int64_t offset = 0;  // elements into the flat gradient buffer
  int64_t numel = 0;
  std::vector<std::string> parameters;  // names, flat-layout order
};

class GradientBuckets {
 public:
  // Buckets of consecutive parameters of the flat layout, each closed once it holds `bucket_bytes`; the
  // launch order is the order in which backward is expected to finish them (the bucket whose earliest
  // parameter in the model comes last goes first). Installs the accumulator hooks on `model`'s parameters.
  GradientBuckets(models::DecoderModel& model, FlatParameters& flat, int64_t bucket_bytes);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  int size() const { return static_cast<int>(buckets_.size()); }
  // Bucket `i` of the launch order.
  const GradientBucket& bucket(int i) const { return buckets_[i]; }

  // Arms the hooks for one backward pass. `launch(i)` starts bucket i of the launch order; it runs on the
  // thread that finished the bucket's last gradient and may throw (the backward then fails).
  // `first_ready`, if given, runs once, on that thread, when the first gradient of this pass is final
  // (step timings: where forward ends and the gradients begin to arrive).
  void Begin(std::function<void(int)> launch, std::function<void()> first_ready = nullptr);
  // After backward: launches, in order, the buckets not yet started (parameters that got no gradient this
  // time), then disarms. Returns the number of buckets launched here.
  int LaunchRemaining();
  // Disarms without launching (after a failure).
  void Disarm();

 private:
  class ReadyHook;
  void OnParameterReady(int bucket);
  void LaunchReadyLocked();

  std::vector<GradientBucket> buckets_;  // launch order
  std::vector<int> parameters_per_bucket_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive so the hooks stay
  std::vector<uintptr_t> hook_keys_;

  std::mutex mutex_;
  bool armed_ = false;
  std::function<void(int)> launch_;
  std::function<void()> first_ready_;  // cleared once called
  std::vector<int> pending_;  // per bucket: parameters whose gradient is not final yet
  int next_ = 0;              // next bucket of the launch order to start
};

}  // namespace tigon::engine
