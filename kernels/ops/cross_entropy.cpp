// Fused cross entropy (Liger's design): forward reads the logits row by row with an online softmax and,
// when the logits need a gradient, overwrites them with d loss / d logits in the same kernel, so that no
// [N, V] probability or gradient tensor is ever allocated. Saved: the gradient (that is, the logits
// buffer). Backward only scales it by grad_output (per row for reduction "none"; for a scalar
// grad_output a host check skips the pass when it is 1, the usual case, saving a read and a write of the
// logits).
//
// The caller's logits are overwritten when they need a gradient and have a contiguous last dimension
// (otherwise a contiguous copy is made and overwritten instead). Their version counter is bumped, so a
// graph that saved them for another backward fails loudly instead of reading a gradient. token_weights
// get no gradient.
#include "kernels/ops/cross_entropy.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "kernels/ops/ops.h"

#ifdef TIGON_CUDA_KERNELS
#include "kernels/cuda/cross_entropy.h"
#include "kernels/ops/cuda_glue.h"
#endif

namespace tigon::ops {
namespace detail {
namespace {

// One row of the fused algorithm on the CPU, in acc_t (fp32, fp64 for fp64 logits) with double row sums:
// the online softmax (running max and rescaled sum in one pass), then the gradient pass over the row.
template <typename scalar_t, typename acc_t>
void CrossEntropyRowsCpu(scalar_t* logits, int64_t row_stride, int64_t n_rows, int64_t vocab, const int64_t* target,
                         const acc_t* weights, const CrossEntropyOptions& options, acc_t grad_scale, bool write_grad,
                         acc_t* loss) {
  const acc_t cap = static_cast<acc_t>(options.softcap);
  const bool softcap = options.softcap > 0;
  const acc_t eps = static_cast<acc_t>(options.label_smoothing);
  const acc_t z = static_cast<acc_t>(options.z_loss_scale);
  auto capped = [&](scalar_t raw) {
    const acc_t x = static_cast<acc_t>(raw);
    return softcap ? cap * std::tanh(x / cap) : x;
  };
  at::parallel_for(0, n_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      scalar_t* x = logits + row * row_stride;
      const int64_t t = target[row];
      if (t == options.ignore_index) {
        loss[row] = 0;
        if (write_grad) std::fill(x, x + vocab, static_cast<scalar_t>(0));
        continue;
      }
      TORCH_CHECK(t >= 0 && t < vocab, "cross_entropy: target ", t, " out of range [0, ", vocab, ")");
      // Finite start, so that -inf logits add exp(-inf) = 0 rather than NaN.
      acc_t m = std::numeric_limits<acc_t>::lowest();
      // The two row sums in double: a sequential fp32 sum over V = 256000 terms drifts by ~1e-4 relative.
      double s = 0, sum_x = 0;
      for (int64_t j = 0; j < vocab; ++j) {
        const acc_t v = capped(x[j]);
        sum_x += v;
        if (v > m) {
          s = s * static_cast<double>(std::exp(m - v)) + 1;
          m = v;
        } else {
          s += static_cast<double>(std::exp(v - m));
        }
      }
      const acc_t lse = m + static_cast<acc_t>(std::log(s));
      const acc_t w = weights ? weights[row] : acc_t(1);
      const acc_t x_t = capped(x[t]);
      // The smoothing term only when asked for: a -inf (masked) logit makes sum_x -inf, and 0 * inf is NaN.
      const acc_t smooth = eps != 0 ? eps * (lse - static_cast<acc_t>(sum_x / static_cast<double>(vocab))) : acc_t(0);
      loss[row] = w * ((1 - eps) * (lse - x_t) + smooth + z * lse * lse);
      if (!write_grad) continue;
      const acc_t scale = grad_scale * w;
      const acc_t coef_p = scale * (1 + 2 * z * lse);
      const acc_t coef_const = scale * eps / static_cast<acc_t>(vocab);
      const acc_t coef_t = scale * (1 - eps);
      for (int64_t j = 0; j < vocab; ++j) {
        const acc_t v = capped(x[j]);
        acc_t d = coef_p * std::exp(v - lse) - coef_const - (j == t ? coef_t : acc_t(0));
        if (softcap) d *= 1 - (v / cap) * (v / cap);
        x[j] = static_cast<scalar_t>(d);
      }
    }
  });
}

}  // namespace

torch::ScalarType LossDType(const torch::Tensor& logits) {
  return logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

torch::Tensor CountValid(const torch::Tensor& target, int64_t ignore_index) { return target.ne(ignore_index).sum(); }

CrossEntropyOptions OptionsFromSchema(int64_t ignore_index, const std::string& reduction, double label_smoothing,
                                      double z_loss_scale, double softcap) {
  CrossEntropyOptions options;
  options.ignore_index = ignore_index;
  if (reduction == "mean") {
    options.reduction = Reduction::kMean;
  } else if (reduction == "sum") {
    options.reduction = Reduction::kSum;
  } else if (reduction == "none") {
    options.reduction = Reduction::kNone;
  } else {
    TORCH_CHECK(false, "reduction must be \"mean\", \"sum\" or \"none\", got \"", reduction, "\"");
  }
  options.label_smoothing = label_smoothing;
  options.z_loss_scale = z_loss_scale;
  options.softcap = softcap;
  return options;
}

torch::Tensor ReduceLoss(const torch::Tensor& loss_rows, const torch::Tensor& n_valid, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return loss_rows;
    case Reduction::kSum:
      return loss_rows.sum();
    case Reduction::kMean:
    default:
      return loss_rows.sum() / n_valid.clamp_min(1).to(loss_rows.scalar_type());
  }
}

void CrossEntropyRows(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& token_weights,
                      const CrossEntropyOptions& options, const torch::Tensor& n_valid, double grad_scale,
                      bool write_grad, const torch::Tensor& loss_rows) {
  const int64_t n_rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(logits.stride(1) == 1 || vocab == 1, "cross_entropy: logits need a contiguous last dim");
  TORCH_CHECK(loss_rows.is_contiguous() && loss_rows.numel() == n_rows && loss_rows.scalar_type() == LossDType(logits),
              "cross_entropy: bad loss_rows buffer");
  if (n_rows == 0) return;
  const torch::Tensor target_c = target.contiguous();
#ifdef TIGON_CUDA_KERNELS
  if (logits.is_cuda()) {
    c10::DeviceGuard guard(logits.device());
    const torch::Tensor weights_c =
        token_weights.defined() ? token_weights.to(torch::kFloat).contiguous() : torch::Tensor();
    cuda::CrossEntropyParams p;
    p.logits = logits.data_ptr();
    p.logits_row_stride = logits.stride(0);
    p.dtype = CudaDType(logits);
    p.target = target_c.data_ptr<int64_t>();
    p.token_weights = weights_c.defined() ? weights_c.data_ptr<float>() : nullptr;
    p.n_valid = n_valid.defined() ? n_valid.data_ptr<int64_t>() : nullptr;
    p.loss = loss_rows.data_ptr<float>();
    p.n_rows = n_rows;
    p.vocab = vocab;
    p.ignore_index = options.ignore_index;
    p.label_smoothing = static_cast<float>(options.label_smoothing);
    p.z_loss_scale = static_cast<float>(options.z_loss_scale);
    p.softcap = static_cast<float>(options.softcap);
    p.grad_scale = static_cast<float>(grad_scale);
    p.write_grad = write_grad;
    CheckLaunch(cuda::cross_entropy_forward(p, CurrentCudaStream(logits.device())), "cross_entropy_forward");
    return;
  }
#endif
  TORCH_CHECK(logits.device().is_cpu(), "cross_entropy: this build has no CUDA kernels for ", logits.device());
  double scale = grad_scale;
  if (n_valid.defined()) scale /= static_cast<double>(std::max<int64_t>(n_valid.item<int64_t>(), 1));
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kBFloat16, torch::kHalf, logits.scalar_type(), "cross_entropy_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const torch::Tensor weights_c =
        token_weights.defined() ? token_weights.to(LossDType(logits)).contiguous() : torch::Tensor();
    CrossEntropyRowsCpu<scalar_t, acc_t>(logits.data_ptr<scalar_t>(), logits.stride(0), n_rows, vocab,
                                         target_c.data_ptr<int64_t>(),
                                         weights_c.defined() ? weights_c.data_ptr<acc_t>() : nullptr, options,
                                         static_cast<acc_t>(scale), write_grad, loss_rows.data_ptr<acc_t>());
  });
}

}  // namespace detail

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void CheckInputs(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& token_weights) {
  TORCH_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got ", logits.sizes());
  TORCH_CHECK(logits.size(1) > 0, "cross_entropy: empty vocabulary");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
              "cross_entropy: target must be [N] with N = ", logits.size(0), ", got ", target.sizes());
  TORCH_CHECK(target.scalar_type() == torch::kLong, "cross_entropy: target must be int64");
  TORCH_CHECK(target.device() == logits.device(), "cross_entropy: target and logits on different devices");
  if (token_weights.defined()) {
    TORCH_CHECK(token_weights.dim() == 1 && token_weights.size(0) == logits.size(0),
                "cross_entropy: token_weights must be [N]");
    TORCH_CHECK(token_weights.device() == logits.device(), "cross_entropy: token_weights on another device");
  }
}

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  // Optional tensors travel as c10::optional: LibTorch 1.13's Function::apply rejects undefined tensors.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& target,
                               const c10::optional<torch::Tensor>& maybe_token_weights,
                               const CrossEntropyOptions& options, bool need_grad) {
    const torch::Tensor token_weights = maybe_token_weights.value_or(torch::Tensor());
    CheckInputs(logits, target, token_weights);
    // The kernels take any row stride but need unit stride along the vocabulary and non-overlapping rows.
    const bool usable = logits.stride(1) == 1 && (logits.size(0) <= 1 || logits.stride(0) >= logits.size(1));
    const torch::Tensor work = usable ? logits : logits.contiguous();
    const torch::Tensor n_valid =
        options.reduction == Reduction::kMean ? detail::CountValid(target, options.ignore_index) : torch::Tensor();
    const torch::Tensor loss_rows = torch::empty({logits.size(0)}, logits.options().dtype(detail::LossDType(logits)));
    detail::CrossEntropyRows(work, target, token_weights, options, n_valid, 1.0, need_grad, loss_rows);
    if (need_grad) {
      if (usable) logits.unsafeGetTensorImpl()->bump_version();
      // A new handle on the same storage: autograd can then hand it to .grad without a copy (AccumulateGrad
      // steals a gradient only when nothing else holds its TensorImpl, and the caller holds `logits`).
      ctx->saved_data["grad"] = work.detach();
      ctx->saved_data["reduction"] = static_cast<int64_t>(options.reduction);
    }
    return detail::ReduceLoss(loss_rows, n_valid, options.reduction);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::Tensor grad = ctx->saved_data["grad"].toTensor();
    ctx->saved_data.erase("grad");  // ours is then the only reference; a second backward fails loudly
    const auto reduction = static_cast<Reduction>(ctx->saved_data["reduction"].toInt());
    const torch::Tensor& grad_output = grad_outputs[0];
    if (reduction == Reduction::kNone) {
      grad.mul_(grad_output.unsqueeze(1));
    } else if (grad_output.item<double>() != 1.0) {  // a host sync, cheaper than a pass over the logits
      grad.mul_(grad_output);
    }
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor CrossEntropyOp(const torch::Tensor& logits, const torch::Tensor& target,
                             const c10::optional<torch::Tensor>& token_weights, int64_t ignore_index,
                             c10::string_view reduction, double label_smoothing, double z_loss_scale, double softcap) {
  const auto options = detail::OptionsFromSchema(ignore_index, std::string(reduction.data(), reduction.size()),
                                                 label_smoothing, z_loss_scale, softcap);
  return cross_entropy(logits, target, options, token_weights.has_value() ? *token_weights : torch::Tensor());
}

}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                            const CrossEntropyOptions& options, const torch::Tensor& token_weights) {
  const bool need_grad = torch::GradMode::is_enabled() && logits.requires_grad();
  const c10::optional<torch::Tensor> maybe_weights =
      token_weights.defined() ? c10::optional<torch::Tensor>(token_weights) : c10::nullopt;
  return CrossEntropyFunction::apply(logits, target, maybe_weights, options, need_grad);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def(
      "cross_entropy(Tensor logits, Tensor target, Tensor? token_weights=None, int ignore_index=-100, "
      "str reduction=\"mean\", float label_smoothing=0.0, float z_loss_scale=0.0, float softcap=0.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) { m.impl("cross_entropy", &tigon::ops::CrossEntropyOp); }
