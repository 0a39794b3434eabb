#include "parallel/gradient_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <climits>
#include <map>
#include <stdexcept>

namespace tigon::engine {

// Runs after the parameter's AccumulateGrad node has added this backward's gradient into the flat buffer
// (on the autograd thread of the parameter's device, with that node's stream current).
class GradientBuckets::ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(GradientBuckets* owner, int bucket) : owner_(owner), bucket_(bucket) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    owner_->OnParameterReady(bucket_);
    return outputs;
  }

 private:
  GradientBuckets* owner_;
  int bucket_;
};

GradientBuckets::GradientBuckets(models::DecoderModel& model, FlatParameters& flat, int64_t bucket_bytes) {
  const auto& slots = flat.slots();
  const int64_t element_bytes = flat.grads().element_size();
  std::map<std::string, int> model_index;
  auto& parameters = model.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) model_index[parameters[i].name] = static_cast<int>(i);

  // Consecutive slots of the flat layout, closed at bucket_bytes and where the 1-D parameters (norms,
  // biases of every layer, finished throughout backward) begin; each bucket remembers the earliest model
  // position among its parameters (backward finishes that parameter last).
  struct Planned {
    GradientBucket bucket;
    int earliest = INT_MAX;
  };
  std::vector<Planned> planned;
  for (const auto& slot : slots) {
    if (planned.empty() || planned.back().bucket.numel * element_bytes >= bucket_bytes ||
        slot.offset == flat.decay_numel()) {
      planned.emplace_back();
      planned.back().bucket.offset = slot.offset;
    }
    auto& current = planned.back();
    TORCH_CHECK(current.bucket.offset + current.bucket.numel == slot.offset, "flat layout is not contiguous");
    current.bucket.numel += slot.numel;
    current.bucket.parameters.push_back(slot.name);
    current.earliest = std::min(current.earliest, model_index.at(slot.name));
  }
  std::stable_sort(planned.begin(), planned.end(),
                   [](const Planned& a, const Planned& b) { return a.earliest > b.earliest; });

  std::map<std::string, int> bucket_of;
  for (const auto& p : planned) {
    for (const auto& name : p.bucket.parameters) bucket_of[name] = static_cast<int>(buckets_.size());
    parameters_per_bucket_.push_back(static_cast<int>(p.bucket.parameters.size()));
    buckets_.push_back(p.bucket);
  }
  pending_ = parameters_per_bucket_;

  for (auto& parameter : parameters) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameter.tensor);
    TORCH_CHECK(accumulator, "parameter ", parameter.name, " has no gradient accumulator");
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<ReadyHook>(this, bucket_of.at(parameter.name))));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradientBuckets::~GradientBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradientBuckets::Begin(std::function<void(int)> launch, std::function<void()> first_ready) {
  std::lock_guard<std::mutex> lock(mutex_);
  launch_ = std::move(launch);
  first_ready_ = std::move(first_ready);
  pending_ = parameters_per_bucket_;
  next_ = 0;
  armed_ = true;
}

void GradientBuckets::OnParameterReady(int bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // a backward outside a data-parallel step (none today)
  if (first_ready_) {
    auto first_ready = std::move(first_ready_);
    first_ready_ = nullptr;
    first_ready();
  }
  pending_[bucket] -= 1;
  LaunchReadyLocked();
}

void GradientBuckets::LaunchReadyLocked() {
  while (next_ < size() && pending_[next_] <= 0) {
    const int bucket = next_++;
    launch_(bucket);
  }
}

int GradientBuckets::LaunchRemaining() {
  std::lock_guard<std::mutex> lock(mutex_);
  int launched = 0;
  if (armed_) {
    armed_ = false;
    while (next_ < size()) {
      ++launched;
      launch_(next_++);
    }
  }
  launch_ = nullptr;
  first_ready_ = nullptr;
  return launched;
}

void GradientBuckets::Disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  launch_ = nullptr;
  first_ready_ = nullptr;
}

}  // namespace tigon::engine
