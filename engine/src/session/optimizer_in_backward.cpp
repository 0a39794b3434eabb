#include "session/optimizer_in_backward.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <memory>
#include <utility>

#include "kernels/ops/ops.h"

#ifdef TIGON_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tigon::engine {

namespace {

// Runs right after AccumulateGrad stored a parameter's gradient as its .grad: with the update already
// queued, the .grad is dropped at once, so no gradient outlives its update (the Llama-3-8B lm_head's is 1 GiB).
class DropStoredGradient final : public torch::autograd::FunctionPostHook {
 public:
  DropStoredGradient(const bool* armed, torch::Tensor parameter) : armed_(armed), parameter_(std::move(parameter)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (*armed_) parameter_.mutable_grad().reset();
    return outputs;
  }

 private:
  const bool* armed_;
  torch::Tensor parameter_;
};

}  // namespace

OptimizerInBackward::OptimizerInBackward(FlatParameters* flat, bool use_update_stream)
    : flat_(flat), use_update_stream_(use_update_stream) {
  auto& views = flat_->views();
  done_.assign(views.size(), false);
  for (size_t k = 0; k < views.size(); ++k) {
    // A leaf's hook runs when its gradient is final (every use summed), just before AccumulateGrad
    // stores it as .grad; no later node of the backward reads this parameter, so updating it is safe.
    views[k].register_hook([this, k](const torch::Tensor& grad) {
      if (armed_) OnGradient(k, grad);
    });
    // The variable holds its accumulator weakly: kept here, the same one (with its hook) serves every backward.
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(views[k]));
    accumulators_.back()->add_post_hook(std::make_unique<DropStoredGradient>(&armed_, views[k]));
  }
}

void OptimizerInBackward::Arm(const AdamWOptions& options, bool fused) {
  options_ = options;
  fused_ = fused;
  updated_ = 0;
  std::fill(done_.begin(), done_.end(), false);
  const auto doubles = torch::TensorOptions().dtype(torch::kDouble).device(flat_->params().device());
  if (fused_) {
    // Each slot's row is rewritten by its update (or by Disarm's zero-gradient one) before it is summed.
    if (!grad_square_partials_.defined())
      grad_square_partials_ = torch::empty({static_cast<int64_t>(done_.size()), ops::kAdamWGradSquarePartials}, doubles);
  } else {
    squared_norm_ = torch::zeros({}, doubles);
  }
  armed_ = true;
}

void OptimizerInBackward::OnGradient(size_t slot, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  const torch::Tensor flat_grad = grad.contiguous().view({-1});
#ifdef TIGON_WITH_CUDA
  // The update is memory-bound and the backward matmuls are compute-bound: run the update on its own
  // stream so it overlaps the rest of the backward. It waits for this gradient only; the parameter it
  // writes is not read again by this backward (see the hook above).
  const bool on_update_stream = use_update_stream_ && grad.is_cuda();
  std::optional<c10::cuda::CUDAStreamGuard> update_stream_guard;
  if (on_update_stream) {
    const auto index = grad.device().index();
    if (!update_stream_) update_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    at::cuda::CUDAEvent gradient_ready;
    gradient_ready.record(c10::cuda::getCurrentCUDAStream(index));
    gradient_ready.block(*update_stream_);
    update_stream_guard.emplace(*update_stream_);
  }
#endif
  // The fused AdamW sums the gradient's squares in the pass that updates the parameter.
  if (!fused_) squared_norm_.add_(ops::squared_norm(flat_grad));
  flat_->AdamWStepSlot(slot, flat_grad, options_, fused_, GradSquarePartials(slot));
#ifdef TIGON_WITH_CUDA
  if (on_update_stream) {
    update_stream_guard.reset();
    // The allocator must not hand these gradients' memory to the backward before the update has read them.
    grad.record_stream(*update_stream_);
    flat_grad.record_stream(*update_stream_);
    update_pending_ = true;
  }
#endif
  done_[slot] = true;
  ++updated_;
}

torch::Tensor OptimizerInBackward::GradSquarePartials(size_t slot) const {
  return fused_ ? grad_square_partials_[static_cast<int64_t>(slot)] : torch::Tensor();
}

void OptimizerInBackward::JoinUpdateStream() {
#ifdef TIGON_WITH_CUDA
  if (!update_pending_) return;
  // Whatever runs next on the compute stream (the next forward, a checkpoint read, the loss) sees the
  // updated parameters and optimizer state.
  at::cuda::CUDAEvent updates_done;
  updates_done.record(*update_stream_);
  updates_done.block(c10::cuda::getCurrentCUDAStream(update_stream_->device_index()));
  update_pending_ = false;
#endif
}

OptimizerInBackward::Result OptimizerInBackward::Disarm(bool complete) {
  armed_ = false;
  JoinUpdateStream();
  Result result;
  result.updated = updated_;
  if (complete) {
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < done_.size(); ++k) {
      if (done_[k]) continue;
      const auto& slot = flat_->slots()[k];
      flat_->AdamWStepSlot(k, torch::zeros({slot.numel}, flat_->params().options()), options_, fused_,
                           GradSquarePartials(k));
    }
    result.squared_norm = fused_ ? grad_square_partials_.sum().item<double>() : squared_norm_.item<double>();
  }
  squared_norm_ = torch::Tensor();
  return result;
}

}  // namespace tigon::engine
