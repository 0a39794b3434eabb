// Parameters, gradients and AdamW state in flat buffers (docs/ARCHITECTURE.md): every model parameter becomes
// a view into one flat buffer and its gradient a view into another, so AdamW runs as one kernel over the
// buffer and gradients can be all-reduced in large buckets.
//
// Layout: parameters with weight decay (matrices, embeddings) first, then those without (norm weights and
// biases, 1-D), following Hugging Face Trainer's grouping. Each group is a contiguous range.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "kernels/ops/common.h"
#include "models/model.h"

namespace tigon::engine {

enum class Precision { kFp32, kBf16, kBf16Mixed };

Precision ParsePrecision(const std::string& name);  // throws std::invalid_argument
const char* PrecisionName(Precision precision);
torch::Dtype ModelDtype(Precision precision);

struct ParameterSlot {
  std::string name;
  int64_t offset = 0;
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

class FlatParameters {
 public:
  // Moves the model's parameters into the flat buffer (the model's tensors become views), allocates the
  // AdamW state and, unless `allocate_grads` is false, the gradient buffer (attached as each parameter's
  // .grad; see AttachGrads).
  FlatParameters(models::DecoderModel& model, Precision precision, bool allocate_grads = true);

  int64_t numel() const { return params_.numel(); }
  int64_t decay_numel() const { return decay_numel_; }
  const std::vector<ParameterSlot>& slots() const { return slots_; }
  Precision precision() const { return precision_; }

  torch::Tensor& params() { return params_; }
  torch::Tensor& grads() { return grads_; }
  torch::Tensor& master() { return master_; }  // fp32 copy (bf16_mixed), undefined otherwise
  torch::Tensor& exp_avg() { return exp_avg_; }
  torch::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  // The parameter tensors (views into params()), in slot order: views()[k] is slots()[k].
  std::vector<torch::Tensor>& views() { return views_; }

  bool has_grads() const { return grads_.defined(); }
  // Allocates the gradient buffer (zeros) when absent and makes each slice its parameter's .grad, so
  // backward accumulates into it.
  void AttachGrads();
  // Leaves every parameter without .grad (the buffer, if any, is kept): backward then hands each
  // gradient to autograd's own storage (optimizer_in_backward.h).
  void DetachGrads();
  // AdamW on one parameter with the given flat gradient (weight decay only if its slot is decayed). With
  // the fused kernel, `grad_square_partials` (optional; see ops::adamw_step) receives the gradient's
  // squares from the same pass.
  void AdamWStepSlot(size_t slot, const torch::Tensor& grad, AdamWOptions options, bool fused,
                     const torch::Tensor& grad_square_partials = {});

  void ZeroGrads();
  // L2 norm of grads() * scale, accumulated in fp64 in one read of the buffer (ops::squared_norm).
  double GradNorm(double scale) const;
  // One AdamW update over both groups; weight decay applies to the first group only.
  void AdamWStep(const AdamWOptions& options, bool fused);
  // Zeroes the AdamW moments and resets the master copy from the parameters.
  void ResetOptimizerState();
  // After the parameters were overwritten (checkpoint load): refresh the master copy.
  void SyncMasterFromParams();

 private:
  // AdamW over elements [start, start + n) of `params` (params_ or an alias of it) with `grad`.
  void AdamWRange(const torch::Tensor& params, int64_t start, int64_t n, const torch::Tensor& grad,
                  const AdamWOptions& options, bool fused, const torch::Tensor& grad_square_partials = {});

  Precision precision_;
  torch::Tensor params_, grads_, master_, exp_avg_, exp_avg_sq_;
  std::vector<ParameterSlot> slots_;
  std::vector<torch::Tensor> views_;
  int64_t decay_numel_ = 0;
};

}  // namespace tigon::engine
