// The decoder: embedding -> N x (RMSNorm, attention, residual, RMSNorm, gated MLP, residual) -> RMSNorm ->
// lm_head, with each family's differences read from its ModelConfig (the traits and fields its spec in
// models/families/ sets; Hugging Face's modeling_<family>.py, eager attention). RMSNorm, RoPE, the gated
// activation and the lm_head + loss go through the op table; the residual add is fused into the following
// norm when rms_norm is fused, and then the norm output feeding the q/k/v and gate/up projections is
// recomputed in backward instead of kept.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>


#include "kernels/ops/fused_linear_cross_entropy.h"
#include "kernels/ops/glu_linear.h"
#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "kernels/torch_compat.h"
#include "models/attention.h"
#include "models/model.h"
#include "models/rotary.h"

namespace tigon::models {
namespace {

std::string ShapeString(torch::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string LayerPrefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every RMSNorm weight: *_layernorm, q_norm / k_norm and the final model.norm.
bool IsNormWeight(const std::string& name) { return EndsWith(name, "norm.weight"); }

// The norm in front of the MLP: post_attention_layernorm in Llama's naming, pre_feedforward_layernorm when
// post_attention_layernorm is the attention output's own norm (sandwich norms).
const char* PreMlpNormName(const FamilyTraits& traits) {
  return traits.sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
}

}  // namespace

DecoderModel::DecoderModel(ModelConfig config, OpTable ops, torch::TensorOptions options)
    : config_(std::move(config)), ops_(std::move(ops)) {
  for (const auto& op : OpTable::OpNames(config_)) ops_.Get(op);  // throws when the table lacks one
  const auto dtype = options.dtype().toScalarType();
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) {
    throw ModelError("model parameters must be float32, bfloat16 or float16, not " + std::string(c10::toString(dtype)));
  }
  if (static_cast<int64_t>(config_.sliding_window.size()) != config_.num_hidden_layers) {
    config_.sliding_window.resize(config_.num_hidden_layers, 0);
  }
  for (auto& parameter : ParameterShapes(config_)) AddParameter(parameter.name, std::move(parameter.shape), options);
  inv_freq_ = RopeInverseFrequencies(config_);
  if (config_.local_rope_theta > 0) local_inv_freq_ = RopeInverseFrequencies(config_, /*sliding_layers=*/true);
}

std::vector<ParameterShape> ParameterShapes(const ModelConfig& c) {
  std::vector<ParameterShape> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape) { out.push_back({std::move(name), std::move(shape)}); };
  const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim,
                kv_dim = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  const FamilyTraits& t = c.traits;
  add("model.embed_tokens.weight", {c.vocab_size, h});
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = LayerPrefix(layer);
    if (t.fused_qkv) {
      add(p + "self_attn.o_proj.weight", {h, q_dim});
      add(p + "self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, h});
    } else {
      const std::pair<const char*, int64_t> projections[] = {{"q_proj", q_dim}, {"k_proj", kv_dim}, {"v_proj", kv_dim}};
      for (const auto& [name, rows] : projections) {
        add(p + "self_attn." + name + ".weight", {rows, h});
        if (c.attention_bias) add(p + "self_attn." + name + ".bias", {rows});
      }
      add(p + "self_attn.o_proj.weight", {h, q_dim});
      if (c.attention_output_bias) add(p + "self_attn.o_proj.bias", {h});
    }
    if (t.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim});
      add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (t.fused_gate_up) {
      add(p + "mlp.gate_up_proj.weight", {2 * inter, h});
      add(p + "mlp.down_proj.weight", {h, inter});
    } else {
      for (const char* name : {"gate_proj", "up_proj"}) {
        add(p + "mlp." + name + ".weight", {inter, h});
        if (c.mlp_bias) add(p + "mlp." + name + ".bias", {inter});
      }
      add(p + "mlp.down_proj.weight", {h, inter});
      if (c.mlp_bias) add(p + "mlp.down_proj.bias", {h});
    }
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    if (t.sandwich_norms) {
      add(p + "pre_feedforward_layernorm.weight", {h});
      add(p + "post_feedforward_layernorm.weight", {h});
    }
  }
  add("model.norm.weight", {h});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h});
  return out;
}

int64_t ParameterCount(const ModelConfig& config) {
  int64_t total = 0;
  for (const auto& parameter : ParameterShapes(config)) {
    int64_t numel = 1;
    for (int64_t size : parameter.shape) numel *= size;
    total += numel;
  }
  return total;
}

void DecoderModel::AddParameter(const std::string& name, std::vector<int64_t> shape,
                                const torch::TensorOptions& options) {
  index_[name] = params_.size();
  params_.push_back({name, torch::empty(shape, options).requires_grad_(true)});
}

torch::Dtype DecoderModel::dtype() const { return params_.front().tensor.scalar_type(); }
torch::Device DecoderModel::device() const { return params_.front().tensor.device(); }

torch::Tensor& DecoderModel::parameter(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) throw ModelError("no parameter named '" + name + "' in this " + config_.family + " model");
  return params_[it->second].tensor;
}

const torch::Tensor& DecoderModel::param(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw ModelError("no parameter named '" + name + "' in this " + config_.family + " model");
  return params_[it->second].tensor;
}

namespace {

// splitmix64: decorrelates the per-chunk generator seeds derived from (seed, parameter, chunk).
uint64_t MixSeed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void DecoderModel::InitRandom(uint64_t seed, double initializer_range) {
  // Drawn on the CPU in fp32, then copied: every device and dtype gets the same weights. Each chunk of
  // 2^20 values has its own generator seeded from (seed, parameter, chunk), so the chunks can be drawn in
  // parallel and the values do not depend on the number of threads. The threads are our own:
  // at::parallel_for is header code that runs serially in a translation unit built without OpenMP, and
  // serial draws made an 8B model take 77 s to initialise on the H200 host (about 6 ns per value).
  torch::NoGradGuard no_grad;
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t max_workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  const double norm_identity = 1.0 - config_.traits.norm_offset;  // (offset + weight) starts at 1
  for (size_t index = 0; index < params_.size(); ++index) {
    auto& [name, tensor] = params_[index];
    if (IsNormWeight(name)) {
      tensor.fill_(norm_identity);
    } else if (EndsWith(name, ".bias")) {
      tensor.zero_();
    } else {
      torch::Tensor values = torch::empty({tensor.numel()}, torch::kFloat32);
      const int64_t numel = tensor.numel();
      const int64_t chunks = (numel + kChunk - 1) / kChunk;
      const uint64_t param_seed = MixSeed(seed ^ MixSeed(index + 1));
      std::atomic<int64_t> next_chunk{0};
      std::exception_ptr failure;
      std::mutex failure_mutex;
      auto draw = [&] {
        try {
          for (int64_t chunk = next_chunk++; chunk < chunks; chunk = next_chunk++) {
            auto generator = compat::cpu_generator(MixSeed(param_seed + static_cast<uint64_t>(chunk)));
            const int64_t start = chunk * kChunk;
            values.narrow(0, start, std::min(kChunk, numel - start)).normal_(0.0, initializer_range, generator);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (!failure) failure = std::current_exception();
        }
      };
      std::vector<std::thread> workers;
      for (int64_t w = 1; w < std::min(max_workers, chunks); ++w) workers.emplace_back(draw);
      draw();
      for (auto& worker : workers) worker.join();
      if (failure) std::rethrow_exception(failure);
      tensor.copy_(values.view(tensor.sizes()));
    }
  }
}

void DecoderModel::CheckTokenTensor(const torch::Tensor& ids, const char* what) const {
  if (!ids.defined()) throw ModelError(std::string(what) + " is undefined");
  if (ids.dim() != 2) {
    throw ModelError(std::string(what) + " must be [batch, seq_len], got shape " + ShapeString(ids.sizes()));
  }
  if (at::isFloatingType(ids.scalar_type()) || ids.scalar_type() == torch::kBool) {
    throw ModelError(std::string(what) + " must hold integer token ids, got dtype " +
                     std::string(c10::toString(ids.scalar_type())));
  }
}

torch::Tensor DecoderModel::HiddenStates(const torch::Tensor& input_ids) const {
  CheckTokenTensor(input_ids, "input_ids");
  const auto& c = config_;
  const bool fused_norm = ops_.Get("rms_norm") == OpChoice::kFused;
  const bool fused_rope = ops_.Get("rope") == OpChoice::kFused;
  const bool geglu = c.hidden_act == "gelu_pytorch_tanh";
  const bool fused_mlp = ops_.Get(geglu ? "geglu" : "swiglu") == OpChoice::kFused;
  const FamilyTraits& traits = c.traits;
  const double norm_offset = traits.norm_offset;
  const RMSNormCasting casting = traits.norm_casting;
  const double eps = c.rms_norm_eps;

  auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight) {
    return fused_norm ? ops::rms_norm(x, weight, eps, norm_offset, casting)
                      : reference::rms_norm(x, weight, eps, norm_offset, casting);
  };
  // (norm(x + residual), x + residual)
  auto add_norm = [&](const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight) {
    if (fused_norm) return ops::add_rms_norm(x, residual, weight, eps, norm_offset, casting);
    torch::Tensor sum = residual + x;
    return std::make_tuple(reference::rms_norm(sum, weight, eps, norm_offset, casting), sum);
  };
  auto linear = [&](const torch::Tensor& x, const std::string& name, bool has_bias) {
    return has_bias ? at::linear(x, param(name + ".weight"), param(name + ".bias"))
                    : at::linear(x, param(name + ".weight"));
  };
  // The projections (q/k/v or gate/up) of norm(delta + residual), and the new residual stream. Fused, one
  // node that recomputes the norm in backward instead of keeping its output alive (ops::rms_norm_linears);
  // delta is undefined before the first layer (nothing to add).
  auto norm_project = [&](const torch::Tensor& delta, const torch::Tensor& residual, const torch::Tensor& weight,
                          const std::vector<std::string>& names, bool has_bias)
      -> std::pair<std::vector<torch::Tensor>, torch::Tensor> {
    if (fused_norm) {
      std::vector<torch::Tensor> weights, biases;
      for (const auto& name : names) {
        weights.push_back(param(name + ".weight"));
        if (has_bias) biases.push_back(param(name + ".bias"));
      }
      auto outs = ops::rms_norm_linears(delta.defined() ? delta : residual, delta.defined() ? residual : torch::Tensor(),
                                        weight, eps, norm_offset, casting, weights, biases);
      torch::Tensor stream = residual;
      if (delta.defined()) {
        stream = outs.back();
        outs.pop_back();
      }
      return {outs, stream};
    }
    torch::Tensor normed, stream = residual;
    if (delta.defined()) {
      std::tie(normed, stream) = add_norm(delta, residual, weight);
    } else {
      normed = norm(residual, weight);
    }
    std::vector<torch::Tensor> outs;
    for (const auto& name : names) outs.push_back(linear(normed, name, has_bias));
    return {outs, stream};
  };

  const torch::Tensor ids = input_ids.to(device(), torch::kInt64);
  const int64_t batch = ids.size(0), seq = ids.size(1);
  const int64_t hq = c.num_attention_heads, hk = c.num_key_value_heads, d = c.head_dim;
  torch::Tensor hidden = at::embedding(param("model.embed_tokens.weight"), ids);
  if (traits.scale_embeddings) {
    // Gemma's normalizer is a tensor in the activation dtype: sqrt(hidden_size) rounded to it.
    hidden = hidden * torch::scalar_tensor(std::sqrt(static_cast<double>(c.hidden_size)),
                                           torch::TensorOptions().dtype(hidden.scalar_type()).device(hidden.device()));
  }
  torch::Tensor global_cos, global_sin, local_cos, local_sin;
  std::tie(global_cos, global_sin) = RopeCosSin(inv_freq_, seq, dtype(), device());
  if (local_inv_freq_.defined()) std::tie(local_cos, local_sin) = RopeCosSin(local_inv_freq_, seq, dtype(), device());
  const int64_t rotary_dim = global_cos.size(-1);
  const double scale = 1.0 / std::sqrt(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(d));

  auto rotate = [&](torch::Tensor q, torch::Tensor k, const torch::Tensor& cos,
                    const torch::Tensor& sin) -> std::pair<torch::Tensor, torch::Tensor> {
    torch::Tensor q_pass, k_pass;
    if (rotary_dim < d) {  // partial rotary: only the first rotary_dim channels are rotated
      q_pass = q.narrow(-1, rotary_dim, d - rotary_dim);
      k_pass = k.narrow(-1, rotary_dim, d - rotary_dim);
      q = q.narrow(-1, 0, rotary_dim);
      k = k.narrow(-1, 0, rotary_dim);
    }
    auto [q_rot, k_rot] = fused_rope ? ops::rope(q, k, cos, sin) : reference::rope(q, k, cos, sin);
    if (rotary_dim < d) {
      q_rot = torch::cat({q_rot, q_pass}, -1);
      k_rot = torch::cat({k_rot, k_pass}, -1);
    }
    return {q_rot, k_rot};
  };

  torch::Tensor residual = hidden;
  torch::Tensor delta;  // the residual branch's output still to be added (undefined before layer 0)
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = LayerPrefix(layer);
    // Attention.
    torch::Tensor q, k, v;
    const torch::Tensor& input_norm = param(p + "input_layernorm.weight");
    if (traits.fused_qkv) {
      auto [outs, stream] = norm_project(delta, residual, input_norm, {p + "self_attn.qkv_proj"}, false);
      residual = stream;
      const torch::Tensor& qkv = outs[0];
      q = qkv.narrow(-1, 0, hq * d);
      k = qkv.narrow(-1, hq * d, hk * d);
      v = qkv.narrow(-1, (hq + hk) * d, hk * d);
    } else {
      auto [outs, stream] = norm_project(
          delta, residual, input_norm, {p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"},
          c.attention_bias);
      residual = stream;
      q = outs[0];
      k = outs[1];
      v = outs[2];
    }
    q = q.reshape({batch, seq, hq, d});
    k = k.reshape({batch, seq, hk, d});
    if (traits.qk_norm) {  // per head, over head_dim
      q = norm(q, param(p + "self_attn.q_norm.weight"));
      k = norm(k, param(p + "self_attn.k_norm.weight"));
    }
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    v = v.reshape({batch, seq, hk, d}).transpose(1, 2);
    const int64_t window = c.sliding_window[layer];
    const bool local_rope = window > 0 && local_cos.defined();
    std::tie(q, k) = rotate(q, k, local_rope ? local_cos : global_cos, local_rope ? local_sin : global_sin);
    torch::Tensor attn = CausalAttention(q, k, v, scale, window);
    attn = attn.transpose(1, 2).reshape({batch, seq, hq * d});
    attn = linear(attn, p + "self_attn.o_proj", c.attention_output_bias);
    if (traits.sandwich_norms) attn = norm(attn, param(p + "post_attention_layernorm.weight"));

    // Gated MLP: down(act(gate(x)) * up(x)).
    torch::Tensor gate, up;
    const torch::Tensor& pre_mlp_norm = param(p + PreMlpNormName(traits));
    if (traits.fused_gate_up) {
      auto [outs, stream] = norm_project(attn, residual, pre_mlp_norm, {p + "mlp.gate_up_proj"}, false);
      residual = stream;
      const torch::Tensor& gate_up = outs[0];
      gate = gate_up.narrow(-1, 0, c.intermediate_size);
      up = gate_up.narrow(-1, c.intermediate_size, c.intermediate_size);
    } else {
      auto [outs, stream] =
          norm_project(attn, residual, pre_mlp_norm, {p + "mlp.gate_proj", p + "mlp.up_proj"}, c.mlp_bias);
      residual = stream;
      gate = outs[0];
      up = outs[1];
    }
    torch::Tensor mlp;
    if (fused_mlp) {
      // Activation and down projection in one node that keeps no act(gate) * up for backward.
      const torch::Tensor down_bias = c.mlp_bias ? param(p + "mlp.down_proj.bias") : torch::Tensor();
      // gate and up are used by nothing else: their buffers take their own gradients in backward.
      mlp = ops::glu_linear_consuming_inputs(gate, up, param(p + "mlp.down_proj.weight"), down_bias, geglu);
    } else {
      torch::Tensor act = geglu ? reference::geglu(gate, up) : reference::swiglu(gate, up);
      mlp = linear(act, p + "mlp.down_proj", c.mlp_bias);
    }
    if (traits.sandwich_norms) mlp = norm(mlp, param(p + "post_feedforward_layernorm.weight"));
    delta = mlp;
  }
  if (!delta.defined()) return norm(residual, param("model.norm.weight"));
  return std::get<0>(add_norm(delta, residual, param("model.norm.weight")));
}

torch::Tensor DecoderModel::Logits(const torch::Tensor& input_ids) const {
  const torch::Tensor hidden = HiddenStates(input_ids);
  return at::linear(hidden, param(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"))
      .to(torch::kFloat32);
}

torch::Tensor DecoderModel::LossSum(const torch::Tensor& input_ids, const torch::Tensor& labels,
                                    const torch::Tensor& loss_weights, const CrossEntropyOptions& options) const {
  CheckTargets(input_ids, labels, loss_weights);
  return HeadLossSum(HiddenStates(input_ids), labels, loss_weights, options);
}

torch::Tensor DecoderModel::HeadLossSum(const torch::Tensor& hidden, const torch::Tensor& labels,
                                        const torch::Tensor& loss_weights, const CrossEntropyOptions& given) const {
  const int64_t tokens = hidden.size(0) * hidden.size(1);
  const torch::Tensor flat_hidden = hidden.reshape({tokens, config_.hidden_size});
  const torch::Tensor target = labels.reshape({tokens}).to(device(), torch::kInt64);
  const torch::Tensor weights =
      loss_weights.defined() ? loss_weights.reshape({tokens}).to(device(), torch::kFloat32) : torch::Tensor();
  CrossEntropyOptions options = given;
  options.ignore_index = -100;
  options.reduction = Reduction::kSum;
  const torch::Tensor& lm_head = param(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  torch::Tensor loss;
  if (ops_.Get("fused_linear_cross_entropy") == OpChoice::kFused) {
    // The final norm's output has no other use: its gradient may take its place.
    loss = ops::fused_linear_cross_entropy_consuming_hidden(flat_hidden, lm_head, torch::Tensor(), target, options,
                                                            weights);
  } else {
    // Hugging Face: logits in the model dtype, upcast to fp32 for the loss.
    const torch::Tensor logits = at::linear(flat_hidden, lm_head).to(torch::kFloat32);
    loss = reference::cross_entropy(logits, target, options, weights);
  }
  return loss.to(torch::kFloat32).reshape({});
}

torch::Tensor DecoderModel::HeadLossSumWeightedBy(const torch::Tensor& hidden, const torch::Tensor& labels,
                                                  const ops::ChunkWeightsFn& weights_of, int64_t chunk_multiple) const {
  if (ops_.Get("fused_linear_cross_entropy") != OpChoice::kFused) return torch::Tensor();
  const int64_t tokens = hidden.size(0) * hidden.size(1);
  const torch::Tensor& lm_head = param(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  return ops::fused_linear_cross_entropy_weighted_by(hidden.reshape({tokens, config_.hidden_size}), lm_head,
                                                     labels.reshape({tokens}).to(device(), torch::kInt64), weights_of,
                                                     chunk_multiple)
      .to(torch::kFloat32)
      .reshape({});
}

torch::Tensor DecoderModel::TokenLogProbs(const torch::Tensor& input_ids, const torch::Tensor& labels,
                                          int64_t chunk_tokens) const {
  torch::NoGradGuard no_grad;
  CheckTargets(input_ids, labels, torch::Tensor());
  return HeadLogProbs(HiddenStates(input_ids), labels, chunk_tokens);
}

torch::Tensor DecoderModel::HeadLogProbs(const torch::Tensor& hidden, const torch::Tensor& labels,
                                         int64_t chunk_tokens) const {
  torch::NoGradGuard no_grad;
  const int64_t tokens = hidden.size(0) * hidden.size(1);
  const torch::Tensor flat_hidden = hidden.detach().reshape({tokens, config_.hidden_size});
  const torch::Tensor target = labels.reshape({tokens}).to(device(), torch::kInt64);
  const torch::Tensor& lm_head = param(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  // About 256 MB of fp32 logits per chunk, so a 128k vocabulary never materialises [tokens, V] at once.
  const int64_t chunk = chunk_tokens > 0 ? chunk_tokens : std::max<int64_t>(1, (int64_t{1} << 26) / config_.vocab_size);
  torch::Tensor out = torch::zeros({tokens}, torch::TensorOptions().dtype(torch::kFloat32).device(device()));
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t n = std::min(chunk, tokens - start);
    const torch::Tensor logits = at::linear(flat_hidden.narrow(0, start, n), lm_head).to(torch::kFloat32);
    const torch::Tensor t = target.narrow(0, start, n);
    const torch::Tensor ignored = t == -100;
    const torch::Tensor safe_target = t.masked_fill(ignored, 0).unsqueeze(1);
    const torch::Tensor logp = logits.gather(1, safe_target).squeeze(1) - logits.logsumexp(-1);
    out.narrow(0, start, n).copy_(logp.masked_fill(ignored, 0.0));
  }
  return out.reshape(labels.sizes());
}

void DecoderModel::CheckTargets(const torch::Tensor& input_ids, const torch::Tensor& labels,
                                const torch::Tensor& loss_weights) const {
  CheckTokenTensor(labels, "labels");
  if (!input_ids.defined() || labels.sizes() != input_ids.sizes()) {
    throw ModelError("labels shape " + ShapeString(labels.sizes()) + " does not match input_ids shape " +
                     (input_ids.defined() ? ShapeString(input_ids.sizes()) : std::string("(undefined)")));
  }
  if (loss_weights.defined() && loss_weights.sizes() != input_ids.sizes()) {
    throw ModelError("loss_weights shape " + ShapeString(loss_weights.sizes()) + " does not match input_ids shape " +
                     ShapeString(input_ids.sizes()));
  }
}

void DecoderModel::LoadStateDict(const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<std::string> missing;
  for (const auto& [name, tensor] : params_) {
    if (tensors.find(name) == tensors.end()) missing.push_back(name);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 8) list += ", ...";
    throw ModelError("missing tensor(s) for this " + config_.family + " model (" + std::to_string(missing.size()) +
                     " missing): " + list);
  }
  for (const auto& [name, tensor] : params_) {
    const torch::Tensor& source = tensors.at(name);
    if (source.sizes() != tensor.sizes()) {
      throw ModelError("tensor '" + name + "': expected shape " + ShapeString(tensor.sizes()) + ", got " +
                       ShapeString(source.sizes()));
    }
    if (!at::isFloatingType(source.scalar_type())) {
      throw ModelError("tensor '" + name + "': expected a floating-point dtype, got " +
                       std::string(c10::toString(source.scalar_type())));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : params_) tensor.copy_(tensors.at(name));
}

std::map<std::string, torch::Tensor> DecoderModel::StateDict() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : params_) out.emplace(name, tensor.detach());
  return out;
}

}  // namespace tigon::models
