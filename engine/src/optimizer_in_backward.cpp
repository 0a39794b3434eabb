#include "optimizer_in_backward.h"

#include <torch/torch.h>

#include "kernels/ops/ops.h"

namespace tigon::engine {

OptimizerInBackward::OptimizerInBackward(FlatParameters* flat) : flat_(flat) {
  auto& views = flat_->views();
  done_.assign(views.size(), false);
  for (size_t k = 0; k < views.size(); ++k) {
    // A leaf's hook runs when its gradient is final (every use summed), just before AccumulateGrad
    // stores it as .grad; no later node of the backward reads this parameter, so updating it is safe.
    views[k].register_hook([this, k](const torch::Tensor& grad) {
      if (armed_) OnGradient(k, grad);
    });
  }
}

void OptimizerInBackward::Arm(const AdamWOptions& options, bool fused) {
  options_ = options;
  fused_ = fused;
  updated_ = 0;
  std::fill(done_.begin(), done_.end(), false);
  squared_norm_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(flat_->params().device()));
  armed_ = true;
}

void OptimizerInBackward::OnGradient(size_t slot, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  // AccumulateGrad keeps the previous parameters' gradients as their .grad: free them now, so at most
  // one parameter's gradient outlives its update.
  ReleaseHeld();
  const torch::Tensor flat_grad = grad.contiguous().view({-1});
  squared_norm_.add_(ops::squared_norm(flat_grad));
  flat_->AdamWStepSlot(slot, flat_grad, options_, fused_);
  done_[slot] = true;
  held_.push_back(slot);
  ++updated_;
}

void OptimizerInBackward::ReleaseHeld() {
  auto& views = flat_->views();
  for (size_t k : held_) views[k].mutable_grad().reset();
  held_.clear();
}

OptimizerInBackward::Result OptimizerInBackward::Disarm(bool complete) {
  armed_ = false;
  ReleaseHeld();
  Result result;
  result.updated = updated_;
  if (complete) {
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < done_.size(); ++k) {
      if (done_[k]) continue;
      const auto& slot = flat_->slots()[k];
      flat_->AdamWStepSlot(k, torch::zeros({slot.numel}, flat_->params().options()), options_, fused_);
    }
    result.squared_norm = squared_norm_.item<double>();
  }
  squared_norm_ = torch::Tensor();
  return result;
}

}  // namespace tigon::engine
