// AdamW fused into the backward pass (opt-in per session): each parameter is updated as soon as its
// gradient is final, and that gradient is freed right after, so a training step never holds the full
// gradient buffer (2 bytes per parameter in bf16: 15 GiB for an 8B model). The result equals the
// ordinary ForwardBackward + OptimStep bit for bit (same AdamW kernel on the same gradients); what is
// given up: gradient clipping (it needs the global norm before any update) and all-or-nothing steps
// (a backward that fails part-way has already updated some parameters).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "kernels/ops/common.h"
#include "session/flat_parameters.h"

namespace tigon::engine {

class OptimizerInBackward {
 public:
  // Registers a gradient hook on every parameter view of `flat` (inactive until Arm). With
  // `use_update_stream`, updates of CUDA parameters run on a second stream, overlapped with the backward.
  OptimizerInBackward(FlatParameters* flat, bool use_update_stream);

  // The next backward updates each parameter with `options` (grad_scale included) as its gradient arrives.
  void Arm(const AdamWOptions& options, bool fused);

  struct Result {
    int64_t updated = 0;        // parameters updated during the backward
    double squared_norm = 0.0;  // sum of squared unscaled gradients of those parameters
  };
  // Ends the step: the compute stream waits for the updates queued on the update stream, and parameters
  // the backward did not reach get the update of a zero gradient (as the ordinary path gives them). With
  // `complete` false (the backward failed) only the wait happens.
  Result Disarm(bool complete);

 private:
  void OnGradient(size_t slot, const torch::Tensor& grad);
  void JoinUpdateStream();  // the current stream waits for every update queued on the update stream
  // The fused AdamW's row of partials for `slot`; undefined with the reference AdamW (squared_norm_ instead).
  torch::Tensor GradSquarePartials(size_t slot) const;

  FlatParameters* flat_;
  bool armed_ = false;
  bool fused_ = true;
  AdamWOptions options_;
  std::vector<bool> done_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // each parameter's AccumulateGrad
  int64_t updated_ = 0;
  torch::Tensor squared_norm_;  // fp64 accumulator on the device (reference AdamW)
  // Fused AdamW: one row of fp64 partial sums of squared gradients per slot, written by the update itself.
  torch::Tensor grad_square_partials_;
  bool use_update_stream_ = false;
  bool update_pending_ = false;
#ifdef TIGON_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> update_stream_;
#endif
};

}  // namespace tigon::engine
