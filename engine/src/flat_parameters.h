// Parameters, gradients and AdamW state in flat buffers (DESIGN.md, Engine): every model parameter becomes
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
  // gradient buffer (attached as each parameter's .grad), and the AdamW state.
  FlatParameters(models::DecoderModel& model, Precision precision);

  int64_t numel() const { return params_.numel(); }
  int64_t decay_numel() const { return decay_numel_; }
  const std::vector<ParameterSlot>& slots() const { return slots_; }
  Precision precision() const { return precision_; }

  torch::Tensor& params() { return params_; }
  torch::Tensor& grads() { return grads_; }
  torch::Tensor& master() { return master_; }  // fp32 copy (bf16_mixed), undefined otherwise
  torch::Tensor& exp_avg() { return exp_avg_; }
  torch::Tensor& exp_avg_sq() { return exp_avg_sq_; }

  void ZeroGrads();
  // L2 norm of grads() * scale, accumulated in fp64 over fp32 chunks (no full-size fp32 copy).
  double GradNorm(double scale) const;
  // One AdamW update over both groups; weight decay applies to the first group only.
  void AdamWStep(const AdamWOptions& options, bool fused);
  // Zeroes the AdamW moments and resets the master copy from the parameters.
  void ResetOptimizerState();
  // After the parameters were overwritten (checkpoint load): refresh the master copy.
  void SyncMasterFromParams();

 private:
  Precision precision_;
  torch::Tensor params_, grads_, master_, exp_avg_, exp_avg_sq_;
  std::vector<ParameterSlot> slots_;
  int64_t decay_numel_ = 0;
};

}  // namespace tigon::engine
