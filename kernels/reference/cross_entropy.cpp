// The unfused cross entropy that Hugging Face runs: upcast the logits, optional Gemma 2 softcap through
// tanh, torch's cross_entropy with reduction "none" (label smoothing as torch defines it: the smoothing
// term is -mean_j log p_j), then z-loss, per-token weights and the reduction. Every intermediate is a
// full [N, V] tensor; that is what the fused op avoids.
#include <torch/torch.h>

#include "kernels/reference/reference.h"

namespace tigon::reference {

namespace {

// Per-token losses [N] in fp32 (fp64 when the logits are fp64, for the tests' oracle).
torch::Tensor PerTokenLoss(const torch::Tensor& logits, const torch::Tensor& target, const CrossEntropyOptions& options,
                           const torch::Tensor& token_weights) {
  TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got ", logits.sizes());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), "cross_entropy: target must be [N]");
  TORCH_CHECK(target.scalar_type() == torch::kLong, "cross_entropy: target must be int64");
  torch::Tensor x = logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
  if (options.softcap > 0) x = torch::tanh(x / options.softcap) * options.softcap;
  namespace F = torch::nn::functional;
  torch::Tensor loss = F::cross_entropy(x, target,
                                        F::CrossEntropyFuncOptions()
                                            .reduction(torch::kNone)
                                            .ignore_index(options.ignore_index)
                                            .label_smoothing(options.label_smoothing));
  const torch::Tensor valid = target.ne(options.ignore_index);
  if (options.z_loss_scale != 0) {
    const torch::Tensor lse = torch::logsumexp(x, -1);
    loss = loss + torch::where(valid, options.z_loss_scale * lse * lse, torch::zeros_like(lse));
  }
  if (token_weights.defined()) {
    TORCH_CHECK(token_weights.dim() == 1 && token_weights.size(0) == logits.size(0),
                "cross_entropy: token_weights must be [N]");
    loss = loss * token_weights.to(loss.scalar_type());
  }
  return loss;
}

}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                            const CrossEntropyOptions& options, const torch::Tensor& token_weights) {
  const torch::Tensor loss = PerTokenLoss(logits, target, options, token_weights);
  switch (options.reduction) {
    case Reduction::kNone:
      return loss;
    case Reduction::kSum:
      return loss.sum();
    case Reduction::kMean:
    default: {
      // An all-ignored batch gives 0 (not torch's 0/0 = NaN): a fully masked micro-batch must not poison
      // gradient accumulation.
      const torch::Tensor n_valid = target.ne(options.ignore_index).sum().clamp_min(1).to(loss.scalar_type());
      return loss.sum() / n_valid;
    }
  }
}

}  // namespace tigon::reference
