#include "session/flat_parameters.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"

namespace tigon::engine {

Precision ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "bf16_mixed") return Precision::kBf16Mixed;
  throw std::invalid_argument("unknown precision '" + name + "' (expected fp32, bf16 or bf16_mixed)");
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kBf16Mixed: return "bf16_mixed";
  }
  return "fp32";
}

torch::Dtype ModelDtype(Precision precision) {
  return precision == Precision::kFp32 ? torch::kFloat : torch::kBFloat16;
}

FlatParameters::FlatParameters(models::DecoderModel& model, Precision precision, bool allocate_grads)
    : precision_(precision) {
  torch::NoGradGuard no_grad;
  auto& params = model.parameters();
  TORCH_CHECK(!params.empty(), "model has no parameters");
  const auto device = params.front().tensor.device();
  const auto dtype = ModelDtype(precision);

  // Decayed (>= 2-D) parameters first, then 1-D ones (norms, biases), each group in model order.
  std::vector<size_t> order;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].tensor.dim() >= 2) order.push_back(i);
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].tensor.dim() < 2) order.push_back(i);

  int64_t total = 0;
  for (size_t i : order) {
    const auto& p = params[i];
    ParameterSlot slot;
    slot.name = p.name;
    slot.offset = total;
    slot.numel = p.tensor.numel();
    slot.shape = p.tensor.sizes().vec();
    if (p.tensor.dim() >= 2) decay_numel_ += slot.numel;
    total += slot.numel;
    slots_.push_back(slot);
  }

  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  params_ = torch::empty({total}, options);
  for (size_t k = 0; k < order.size(); ++k) {
    auto& p = params[order[k]];
    const auto& slot = slots_[k];
    auto view = params_.narrow(0, slot.offset, slot.numel).view(slot.shape);
    view.copy_(p.tensor);
    view.requires_grad_(true);
    p.tensor = view;
    views_.push_back(view);
  }
  if (allocate_grads) AttachGrads();

  // AdamW state: the parameters' dtype for bf16 (what the anchor measurements used), fp32 otherwise.
  const auto state_dtype = precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat;
  exp_avg_ = torch::zeros({total}, options.dtype(state_dtype));
  exp_avg_sq_ = torch::zeros({total}, options.dtype(state_dtype));
  if (precision == Precision::kBf16Mixed) master_ = params_.to(torch::kFloat);
}

void FlatParameters::AttachGrads() {
  torch::NoGradGuard no_grad;
  if (!grads_.defined()) grads_ = torch::zeros({params_.numel()}, params_.options());
  for (size_t k = 0; k < views_.size(); ++k) {
    const auto& slot = slots_[k];
    // Backward accumulates in place into an already-defined .grad, i.e. into the flat gradient buffer.
    views_[k].mutable_grad() = grads_.narrow(0, slot.offset, slot.numel).view(slot.shape);
  }
}

void FlatParameters::DetachGrads() {
  for (auto& view : views_) view.mutable_grad().reset();
}

void FlatParameters::ZeroGrads() {
  torch::NoGradGuard no_grad;
  if (grads_.defined()) grads_.zero_();
}

double FlatParameters::GradNorm(double scale) const {
  if (!grads_.defined()) return 0.0;
  return std::sqrt(ops::squared_norm(grads_).item<double>()) * std::abs(scale);
}

void FlatParameters::AdamWRange(const torch::Tensor& params, int64_t start, int64_t n, const torch::Tensor& grad,
                                const AdamWOptions& options, bool fused, const torch::Tensor& grad_square_partials) {
  TORCH_CHECK(fused || !grad_square_partials.defined(), "AdamWRange: only the fused AdamW sums the squares");
  if (n == 0) {
    if (grad_square_partials.defined()) grad_square_partials.zero_();
    return;
  }
  auto m = exp_avg_.narrow(0, start, n);
  auto v = exp_avg_sq_.narrow(0, start, n);
  auto param = params.narrow(0, start, n);
  if (master_.defined()) {
    auto master = master_.narrow(0, start, n);
    if (fused) {
      ops::adamw_step(master, grad, m, v, options, param, grad_square_partials);
    } else {
      reference::adamw_step(master, grad, m, v, options, param);
    }
  } else if (fused) {
    ops::adamw_step(param, grad, m, v, options, {}, grad_square_partials);
  } else {
    reference::adamw_step(param, grad, m, v, options);
  }
}

void FlatParameters::AdamWStepSlot(size_t k, const torch::Tensor& grad, AdamWOptions options, bool fused,
                                   const torch::Tensor& grad_square_partials) {
  torch::NoGradGuard no_grad;
  const auto& slot = slots_.at(k);
  if (slot.offset >= decay_numel_) options.weight_decay = 0.0;
  // Written through an alias with its own version counter: every parameter is a view of params_ and
  // shares its counter, so an ATen write (the reference AdamW) would look to autograd like a change to
  // all the parameters that later backward nodes saved, though only this one, which none of them reads
  // any more, changes (optimizer_in_backward.h).
  AdamWRange(params_.variable_data(), slot.offset, slot.numel, grad, options, fused, grad_square_partials);
}

void FlatParameters::AdamWStep(const AdamWOptions& options, bool fused) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(grads_.defined(), "AdamWStep: this session has no gradient buffer");
  AdamWOptions no_decay = options;
  no_decay.weight_decay = 0.0;
  AdamWRange(params_, 0, decay_numel_, grads_.narrow(0, 0, decay_numel_), options, fused);
  AdamWRange(params_, decay_numel_, params_.numel() - decay_numel_,
             grads_.narrow(0, decay_numel_, params_.numel() - decay_numel_), no_decay, fused);
}

void FlatParameters::ResetOptimizerState() {
  torch::NoGradGuard no_grad;
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  SyncMasterFromParams();
}

void FlatParameters::SyncMasterFromParams() {
  torch::NoGradGuard no_grad;
  if (master_.defined()) master_.copy_(params_);
}

}  // namespace tigon::engine
