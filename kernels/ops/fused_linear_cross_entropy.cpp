// Fused linear + cross entropy (Liger's FLCE): the [N, V] logits are never materialised. The tokens are
// processed in chunks; per chunk
//   logits_c  = h_c @ W^T (+ b)                          cuBLAS, input dtype, one reused [chunk, V] buffer
//   loss_c    = cross entropy rows; d loss / d logits_c   written over logits_c by the CE row kernel
//   grad_W   += dlogits_c^T @ h_c                        addmm_ into an accumulator in W's dtype
//   grad_h_c  = dlogits_c @ W                            written into its rows of grad_hidden (or, for a
//                                                        caller that gives hidden up, over h_c itself)
//   grad_b   += sum_rows dlogits_c                       fp32 accumulator
// For reduction "mean" the 1/n_valid factor uses the count over the WHOLE batch (taken on the device
// before chunking, no host sync), so the chunks' gradients add up to the unchunked ones.
//
// Saved: for "mean"/"sum", the finished gradients (computed during forward; backward only scales them by
// grad_output, skipping the pass when it is 1). For "none" the per-token grad_output must weight each
// row before it enters grad_W, so forward computes losses only and backward recomputes the chunks with
// weights token_weights * grad_output; saved are the inputs.
#include "kernels/ops/fused_linear_cross_entropy.h"

#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>

#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/ops.h"

namespace tigon::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Largest logits chunk we allow. The paper's chunk 2^ceil(log2(ceil(N / ceil(V / H)))) (256 rows at
// N = 8192, V = 128256, H = 4096) keeps the chunk near the size of the hidden states, but every chunk's
// grad_W addmm_ also reads and writes the whole V x H accumulator (2.1 GB in bf16, ~0.5 ms on an H200),
// so fewer, larger chunks win. The sweep in bench/bench_ce_flce_adamw.py on an H200 (N = 8192) gave
// 256 rows 53.6 ms, 512 44.6, 1024 41.0, 1408 42.5, 2048 39.6: past 1024 rows the gain is within noise
// while the buffer grows. 256 MiB it is: 8 x 1024 rows there. The chunk is allocated at the end of the
// forward pass, on top of every saved activation: with a 400 MiB budget, Llama-3-8B at 32,768 tokens on
// one H200 asked for a 392 MiB chunk with 291 MiB free. The chunks are made equal and a multiple of 64
// rows for the GEMM tiles.
constexpr int64_t kChunkBytesBudget = 256LL << 20;
constexpr int64_t kChunkRowMultiple = 64;

struct ChunkedResult {
  torch::Tensor loss_rows;  // [N] fp32 (fp64 for fp64 inputs)
  torch::Tensor grad_hidden, grad_weight, grad_bias;
};

// The chunk loop. row_weights: [N] or undefined; n_valid: 0-dim count for "mean" or undefined.
ChunkedResult RunChunks(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& bias,
                        const torch::Tensor& target, const torch::Tensor& row_weights,
                        const CrossEntropyOptions& options, const torch::Tensor& n_valid, int64_t chunk_size,
                        bool want_hidden, bool want_weight, bool want_bias, bool grad_over_hidden = false,
                        const ChunkWeightsFn* weights_of = nullptr) {
  const int64_t n = hidden.size(0), vocab = weight.size(0);
  const bool write_grad = want_hidden || want_weight || want_bias;
  ChunkedResult r;
  const auto loss_dtype = detail::LossDType(hidden);
  r.loss_rows = torch::empty({n}, hidden.options().dtype(loss_dtype));
  // Over hidden: each chunk's rows of hidden are last read by that chunk's grad_W product, so grad_h can
  // take their place right after it.
  if (want_hidden) r.grad_hidden = grad_over_hidden ? hidden : torch::empty({n, hidden.size(1)}, hidden.options());
  if (want_weight) r.grad_weight = torch::empty(weight.sizes(), weight.options());
  torch::Tensor grad_bias_acc;
  if (want_bias) grad_bias_acc = torch::zeros({vocab}, bias.options().dtype(loss_dtype));
  if (n == 0) {
    if (want_weight) r.grad_weight.zero_();
    if (want_bias) r.grad_bias = grad_bias_acc.to(bias.scalar_type());
    return r;
  }
  const int64_t chunk = std::min(chunk_size, n);
  const torch::Tensor weight_t = weight.t();
  torch::Tensor buffer = torch::empty({chunk, vocab}, hidden.options());
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t rows = std::min(chunk, n - start);
    const torch::Tensor h = hidden.narrow(0, start, rows);
    torch::Tensor logits = buffer.narrow(0, 0, rows);
    if (bias.defined()) {
      at::addmm_out(logits, bias, h, weight_t);
    } else {
      at::mm_out(logits, h, weight_t);
    }
    torch::Tensor chunk_weights = row_weights.defined() ? row_weights.narrow(0, start, rows) : torch::Tensor();
    if (weights_of != nullptr) {  // the losses first (logits untouched), then the weights they give
      detail::CrossEntropyRows(logits, target.narrow(0, start, rows), torch::Tensor(), options, n_valid, 1.0,
                               /*write_grad=*/false, r.loss_rows.narrow(0, start, rows));
      chunk_weights = (*weights_of)(r.loss_rows.narrow(0, start, rows), start, rows).to(r.loss_rows.scalar_type());
      TORCH_CHECK(chunk_weights.dim() == 1 && chunk_weights.size(0) == rows,
                  "fused_linear_cross_entropy_weighted_by: the weights of a chunk of ", rows, " tokens have shape ",
                  chunk_weights.sizes());
      chunk_weights = chunk_weights.contiguous();
    }
    detail::CrossEntropyRows(logits, target.narrow(0, start, rows), chunk_weights, options, n_valid, 1.0, write_grad,
                             r.loss_rows.narrow(0, start, rows));
    if (!write_grad) continue;
    if (want_weight) {
      if (start == 0) {
        at::mm_out(r.grad_weight, logits.t(), h);  // beta = 0: the accumulator is not read on the first chunk
      } else {
        r.grad_weight.addmm_(logits.t(), h);
      }
    }
    if (want_hidden) {
      torch::Tensor grad_h = r.grad_hidden.narrow(0, start, rows);
      at::mm_out(grad_h, logits, weight);
    }
    if (want_bias) grad_bias_acc.add_(logits.sum(0, /*keepdim=*/false, loss_dtype));
  }
  if (want_bias) r.grad_bias = grad_bias_acc.to(bias.scalar_type());
  return r;
}

void CheckInputs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& bias,
                 const torch::Tensor& target, const torch::Tensor& token_weights) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "fused_linear_cross_entropy: hidden must be [N, H] and weight [V, H], got ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(weight.size(0) > 0, "fused_linear_cross_entropy: empty vocabulary");
  TORCH_CHECK(hidden.scalar_type() == weight.scalar_type(), "fused_linear_cross_entropy: hidden is ",
              hidden.scalar_type(), " but weight is ", weight.scalar_type());
  TORCH_CHECK(hidden.device() == weight.device() && target.device() == hidden.device(),
              "fused_linear_cross_entropy: inputs on different devices");
  if (bias.defined()) {
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "fused_linear_cross_entropy: bias must be [V]");
    TORCH_CHECK(bias.scalar_type() == hidden.scalar_type(), "fused_linear_cross_entropy: bias dtype differs");
    TORCH_CHECK(bias.device() == hidden.device(), "fused_linear_cross_entropy: bias on another device");
  }
  TORCH_CHECK(target.dim() == 1 && target.size(0) == hidden.size(0), "fused_linear_cross_entropy: target must be [N]");
  TORCH_CHECK(target.scalar_type() == torch::kLong, "fused_linear_cross_entropy: target must be int64");
  if (token_weights.defined()) {
    TORCH_CHECK(token_weights.dim() == 1 && token_weights.size(0) == hidden.size(0),
                "fused_linear_cross_entropy: token_weights must be [N]");
    TORCH_CHECK(token_weights.device() == hidden.device(),
                "fused_linear_cross_entropy: token_weights on another device");
  }
}

class FusedLinearCrossEntropyFunction : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
 public:
  // Optional tensors travel as c10::optional: LibTorch 1.13's Function::apply rejects undefined tensors.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const c10::optional<torch::Tensor>& maybe_bias, const torch::Tensor& target,
                               const c10::optional<torch::Tensor>& maybe_token_weights,
                               const CrossEntropyOptions& options, int64_t chunk_size, bool need_hidden,
                               bool need_weight, bool need_bias, bool consume_hidden) {
    const torch::Tensor bias = maybe_bias.value_or(torch::Tensor());
    const torch::Tensor token_weights = maybe_token_weights.value_or(torch::Tensor());
    CheckInputs(hidden, weight, bias, target, token_weights);
    const bool any_grad = need_hidden || need_weight || need_bias;
    ctx->saved_data["reduction"] = static_cast<int64_t>(options.reduction);
    ctx->saved_data["chunk_size"] = chunk_size;
    if (options.reduction == Reduction::kNone) {
      const ChunkedResult r = RunChunks(hidden, weight, bias, target, token_weights, options, torch::Tensor(),
                                        chunk_size, false, false, false);
      if (any_grad) {
        ctx->save_for_backward({hidden, weight, bias, target, token_weights});
        ctx->saved_data["need_hidden"] = need_hidden;
        ctx->saved_data["need_weight"] = need_weight;
        ctx->saved_data["need_bias"] = need_bias;
        ctx->saved_data["ignore_index"] = options.ignore_index;
        ctx->saved_data["label_smoothing"] = options.label_smoothing;
        ctx->saved_data["z_loss_scale"] = options.z_loss_scale;
        ctx->saved_data["softcap"] = options.softcap;
      }
      return r.loss_rows;
    }
    const torch::Tensor n_valid =
        options.reduction == Reduction::kMean ? detail::CountValid(target, options.ignore_index) : torch::Tensor();
    // grad_hidden over hidden when the caller gave hidden up and it is a plain [N, H] buffer of its own.
    const bool over_hidden =
        consume_hidden && need_hidden && hidden.is_contiguous() && hidden.data_ptr() != weight.data_ptr();
    const ChunkedResult r = RunChunks(hidden, weight, bias, target, token_weights, options, n_valid, chunk_size,
                                      need_hidden, need_weight, need_bias, over_hidden);
    // A node that saved hidden would now read gradients: its backward fails on the version instead.
    if (over_hidden) torch::autograd::impl::bump_version(hidden);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    ctx->saved_data["grad_weight"] = r.grad_weight;
    ctx->saved_data["grad_bias"] = r.grad_bias;
    return detail::ReduceLoss(r.loss_rows, n_valid, options.reduction);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto reduction = static_cast<Reduction>(ctx->saved_data["reduction"].toInt());
    const torch::Tensor& grad_output = grad_outputs[0];
    torch::Tensor grad_hidden, grad_weight, grad_bias;
    if (reduction == Reduction::kNone) {
      const variable_list saved = ctx->get_saved_variables();
      const torch::Tensor &hidden = saved[0], &weight = saved[1], &bias = saved[2], &target = saved[3],
                          &token_weights = saved[4];
      CrossEntropyOptions options;
      options.reduction = Reduction::kNone;
      options.ignore_index = ctx->saved_data["ignore_index"].toInt();
      options.label_smoothing = ctx->saved_data["label_smoothing"].toDouble();
      options.z_loss_scale = ctx->saved_data["z_loss_scale"].toDouble();
      options.softcap = ctx->saved_data["softcap"].toDouble();
      torch::Tensor row_weights = grad_output.to(detail::LossDType(hidden));
      if (token_weights.defined()) row_weights = row_weights * token_weights.to(row_weights.scalar_type());
      const ChunkedResult r = RunChunks(hidden, weight, bias, target, row_weights, options, torch::Tensor(),
                                        ctx->saved_data["chunk_size"].toInt(), ctx->saved_data["need_hidden"].toBool(),
                                        ctx->saved_data["need_weight"].toBool(), ctx->saved_data["need_bias"].toBool());
      grad_hidden = r.grad_hidden;
      grad_weight = r.grad_weight;
      grad_bias = r.grad_bias;
    } else {
      grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
      grad_weight = ctx->saved_data["grad_weight"].toTensor();
      grad_bias = ctx->saved_data["grad_bias"].toTensor();
      // Released here so that a second backward cannot rescale them again.
      ctx->saved_data.erase("grad_hidden");
      ctx->saved_data.erase("grad_weight");
      ctx->saved_data.erase("grad_bias");
      if (grad_output.item<double>() != 1.0) {  // a host sync, cheaper than a pass over grad_W
        for (torch::Tensor* g : {&grad_hidden, &grad_weight, &grad_bias}) {
          if (g->defined()) g->mul_(grad_output);
        }
      }
    }
    return {grad_hidden,     grad_weight,     grad_bias,       torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// fused_linear_cross_entropy_weighted_by: forward computes the weighted sum and its gradients, as the
// "sum" reduction does; backward scales them by grad_output.
class WeightedByFunction : public torch::autograd::Function<WeightedByFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& target, const ChunkWeightsFn& weights_of, int64_t chunk_size,
                               bool need_hidden, bool need_weight) {
    CheckInputs(hidden, weight, torch::Tensor(), target, torch::Tensor());
    CrossEntropyOptions options;
    options.reduction = Reduction::kSum;
    const bool over_hidden = need_hidden && hidden.is_contiguous() && hidden.data_ptr() != weight.data_ptr();
    const ChunkedResult r = RunChunks(hidden, weight, torch::Tensor(), target, torch::Tensor(), options,
                                      torch::Tensor(), chunk_size, need_hidden, need_weight, false, over_hidden,
                                      &weights_of);
    if (over_hidden) torch::autograd::impl::bump_version(hidden);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    ctx->saved_data["grad_weight"] = r.grad_weight;
    return detail::ReduceLoss(r.loss_rows, torch::Tensor(), Reduction::kSum);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    torch::Tensor grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    torch::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    ctx->saved_data.erase("grad_hidden");
    ctx->saved_data.erase("grad_weight");
    if (grad_outputs[0].item<double>() != 1.0) {
      for (torch::Tensor* g : {&grad_hidden, &grad_weight}) {
        if (g->defined()) g->mul_(grad_outputs[0]);
      }
    }
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

torch::Tensor FusedLinearCrossEntropyOp(const torch::Tensor& hidden, const torch::Tensor& weight,
                                        const c10::optional<torch::Tensor>& bias, const torch::Tensor& target,
                                        const c10::optional<torch::Tensor>& token_weights, int64_t ignore_index,
                                        c10::string_view reduction, double label_smoothing, double z_loss_scale,
                                        double softcap, int64_t chunk_size) {
  const auto options = detail::OptionsFromSchema(ignore_index, std::string(reduction.data(), reduction.size()),
                                                 label_smoothing, z_loss_scale, softcap);
  return fused_linear_cross_entropy_chunked(hidden, weight, bias.has_value() ? *bias : torch::Tensor(), target, options,
                                            token_weights.has_value() ? *token_weights : torch::Tensor(), chunk_size);
}

torch::Tensor FusedLinearCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                      const torch::Tensor& bias, const torch::Tensor& target,
                                      const CrossEntropyOptions& options, const torch::Tensor& token_weights,
                                      int64_t chunk_size, bool consume_hidden) {
  const bool grad_mode = torch::GradMode::is_enabled();
  const bool need_hidden = grad_mode && hidden.requires_grad();
  const bool need_weight = grad_mode && weight.requires_grad();
  const bool need_bias = grad_mode && bias.defined() && bias.requires_grad();
  if (chunk_size <= 0) {
    chunk_size = DefaultFusedLinearCrossEntropyChunk(hidden.size(0), weight.size(0), hidden.size(1),
                                                     static_cast<int64_t>(hidden.element_size()));
  }
  auto optional_of = [](const torch::Tensor& t) {
    return t.defined() ? c10::optional<torch::Tensor>(t) : c10::optional<torch::Tensor>();
  };
  return FusedLinearCrossEntropyFunction::apply(hidden, weight, optional_of(bias), target, optional_of(token_weights),
                                                options, chunk_size, need_hidden, need_weight, need_bias,
                                                consume_hidden);
}

}  // namespace

int64_t DefaultFusedLinearCrossEntropyChunk(int64_t n, int64_t vocab, int64_t hidden, int64_t element_size) {
  (void)hidden;
  if (n <= 1) return 1;
  const int64_t row_bytes = std::max<int64_t>(vocab * element_size, 1);
  const int64_t max_rows = std::max<int64_t>(kChunkBytesBudget / row_bytes, 1);
  const int64_t n_chunks = (n + max_rows - 1) / max_rows;
  int64_t chunk = (n + n_chunks - 1) / n_chunks;
  const int64_t rounded = (chunk + kChunkRowMultiple - 1) / kChunkRowMultiple * kChunkRowMultiple;
  if (rounded <= max_rows) chunk = rounded;
  return std::min(chunk, n);
}

torch::Tensor fused_linear_cross_entropy_weighted_by(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                     const torch::Tensor& target, const ChunkWeightsFn& weights_of,
                                                     int64_t chunk_multiple, int64_t chunk_size) {
  const bool grad_mode = torch::GradMode::is_enabled();
  const int64_t n = hidden.size(0);
  int64_t chunk = chunk_size > 0 ? chunk_size
                                 : DefaultFusedLinearCrossEntropyChunk(n, weight.size(0), hidden.size(1),
                                                                       static_cast<int64_t>(hidden.element_size()));
  if (chunk_multiple > 1) chunk = std::max(chunk_multiple, chunk / chunk_multiple * chunk_multiple);
  return WeightedByFunction::apply(hidden, weight, target, weights_of, std::min(std::max<int64_t>(chunk, 1), std::max<int64_t>(n, 1)),
                                   grad_mode && hidden.requires_grad(), grad_mode && weight.requires_grad());
}

torch::Tensor fused_linear_cross_entropy_chunked(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                 const torch::Tensor& bias, const torch::Tensor& target,
                                                 const CrossEntropyOptions& options, const torch::Tensor& token_weights,
                                                 int64_t chunk_size) {
  return FusedLinearCrossEntropy(hidden, weight, bias, target, options, token_weights, chunk_size, false);
}

torch::Tensor fused_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const torch::Tensor& target,
                                         const CrossEntropyOptions& options, const torch::Tensor& token_weights) {
  return fused_linear_cross_entropy_chunked(hidden, weight, bias, target, options, token_weights, 0);
}

torch::Tensor fused_linear_cross_entropy_consuming_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                          const torch::Tensor& bias, const torch::Tensor& target,
                                                          const CrossEntropyOptions& options,
                                                          const torch::Tensor& token_weights) {
  return FusedLinearCrossEntropy(hidden, weight, bias, target, options, token_weights, 0, true);
}

}  // namespace tigon::ops

TORCH_LIBRARY_FRAGMENT(tigon, m) {
  m.def(
      "fused_linear_cross_entropy(Tensor hidden, Tensor weight, Tensor? bias, Tensor target, "
      "Tensor? token_weights=None, int ignore_index=-100, str reduction=\"mean\", float label_smoothing=0.0, "
      "float z_loss_scale=0.0, float softcap=0.0, int chunk_size=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(tigon, CompositeImplicitAutograd, m) {
  m.impl("fused_linear_cross_entropy", &tigon::ops::FusedLinearCrossEntropyOp);
}
