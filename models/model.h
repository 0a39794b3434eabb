// One configurable decoder covering the families registered in models/families/ (Llama 2/3, Mistral, Qwen2,
// Gemma, Phi3, ...), with Hugging Face parameter names and shapes, loaded from a Hugging Face folder
// (config.json + safetensors) or randomly initialised. Each family's spec (models/families/<name>.cpp) says
// how its config.json reads and what its decoder does differently (FamilyTraits); the decoder reads only
// the parsed ModelConfig.
//
// Parameters are plain tensors in a name-ordered list (not torch::nn::Module) so the engine can move them
// into flat buffers (each parameter becomes a view) and give each a gradient view.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ops/common.h"
#include "kernels/ops/fused_linear_cross_entropy.h"

namespace tigon::models {

// Thrown for bad input (config, checkpoint files, batches). The message names the problem.
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RopeScaling {
  std::string type = "default";  // "default" | "llama3" | "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
};

// How a family's decoder differs from Llama's. Set by the family's spec, copied into each ModelConfig.
struct FamilyTraits {
  bool fused_qkv = false;       // one self_attn.qkv_proj holding [q; k; v] (Phi3)
  bool fused_gate_up = false;   // one mlp.gate_up_proj holding [gate; up] (Phi3)
  double norm_offset = 0.0;     // RMSNorm multiplies by (norm_offset + weight): 1 for Gemma's (1 + w)
  RMSNormCasting norm_casting = RMSNormCasting::kLlama;
  bool scale_embeddings = false;  // embeddings times sqrt(hidden_size), rounded to the activation dtype
  bool qk_norm = false;         // self_attn.q_norm / k_norm: RMSNorm over head_dim on q and k before RoPE
  bool sandwich_norms = false;  // four norms per layer: post_attention_layernorm on the attention output,
                                // pre_feedforward_layernorm before the MLP, post_feedforward_layernorm after
};

struct ModelConfig {
  std::string family;  // model_type, one of SupportedFamilies()
  FamilyTraits traits;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // RoPE of every layer, or of the full-attention ones when local_rope_theta > 0
  RopeScaling rope_scaling;
  double local_rope_theta = 0;  // > 0: the sliding-window layers' own RoPE base (Gemma 3), with local_rope_scaling
  RopeScaling local_rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;          // q/k/v biases (Qwen2 always; Llama's attention_bias)
  bool attention_output_bias = false;   // o_proj bias (Llama's and Gemma's attention_bias; not Qwen2)
  bool mlp_bias = false;                // gate/up/down biases (Llama's mlp_bias)
  double query_pre_attn_scalar = 0;     // attention scale 1/sqrt(this) (Gemma 3); 0: 1/sqrt(head_dim)
  std::string hidden_act = "silu";      // "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
  double partial_rotary_factor = 1.0;   // fraction of head_dim that RoPE rotates (Phi3)
  std::vector<int64_t> sliding_window;  // per layer: attention window in tokens, 0 = full causal
  double initializer_range = 0.02;
  nlohmann::json raw;  // the config as given, written back on save

  // Reads a Hugging Face config (transformers 4 `rope_theta`/`rope_scaling` or 5 `rope_parameters`).
  // Throws ModelError naming the missing or invalid field, or the unsupported model_type.
  static ModelConfig FromJson(const nlohmann::json& json);
  nlohmann::json ToJson() const;
};

enum class OpChoice { kFused, kReference };

// Which implementation each op of the model uses. Names: "rms_norm", "rope", "swiglu" or "geglu" (by
// family), "fused_linear_cross_entropy" (the lm_head + loss), and "adamw" (the session's optimizer step,
// which the engine runs; in the same table so that one override map chooses every op).
class OpTable {
 public:
  static OpTable AllFused(const ModelConfig& config);
  static OpTable AllReference(const ModelConfig& config);
  // The op names this family uses.
  static std::vector<std::string> OpNames(const ModelConfig& config);
  OpChoice Get(const std::string& op) const;
  void Set(const std::string& op, OpChoice choice);  // throws ModelError for an unknown op name
  const std::map<std::string, OpChoice>& entries() const { return entries_; }

 private:
  std::map<std::string, OpChoice> entries_;
};

// The parameters a DecoderModel of `config` has, in its order, with their shapes: what the constructor
// allocates, and what a memory estimate counts before anything is allocated.
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<ParameterShape> ParameterShapes(const ModelConfig& config);
int64_t ParameterCount(const ModelConfig& config);

struct NamedParameter {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  torch::Tensor tensor;
};

class DecoderModel {
 public:
  // Parameters are allocated with `options` (dtype and device; fp32 on the CPU by default), uninitialised.
  DecoderModel(ModelConfig config, OpTable ops, torch::TensorOptions options = torch::TensorOptions());

  const ModelConfig& config() const { return config_; }
  OpTable& ops() { return ops_; }
  const OpTable& ops() const { return ops_; }
  torch::Dtype dtype() const;
  torch::Device device() const;

  // All trainable parameters in a fixed order. Tied embeddings appear once (as embed_tokens).
  std::vector<NamedParameter>& parameters() { return params_; }
  const std::vector<NamedParameter>& parameters() const { return params_; }
  torch::Tensor& parameter(const std::string& name);  // throws ModelError when absent

  // Random initialisation like Hugging Face's (normal(0, initializer_range), norms at their identity).
  void InitRandom(uint64_t seed, double initializer_range);

  // input_ids [B, T] int64 on the parameters' device -> final hidden states [B, T, H] (after the norm).
  // Ids (and labels below) are taken to be in the vocabulary (labels: or -100): shapes and dtypes are
  // checked here (ModelError), values where the batch enters the engine (tigon::CheckBatch).
  torch::Tensor HiddenStates(const torch::Tensor& input_ids) const;
  // -> logits [B, T, V], in fp32.
  torch::Tensor Logits(const torch::Tensor& input_ids) const;
  // Sum over positions with label != -100 of weight * (-log p(label)), as a 0-dim fp32 tensor with
  // autograd; uses fused_linear_cross_entropy or lm_head + reference cross-entropy per the op table.
  // `options` (ignore_index -100 and the sum reduction are the model's): label smoothing and z-loss.
  // Weights may have any sign: with w = -dL/dlp the gradient is that of any loss L of the log-probabilities.
  torch::Tensor LossSum(const torch::Tensor& input_ids, const torch::Tensor& labels,
                        const torch::Tensor& loss_weights, const CrossEntropyOptions& options = {}) const;
  // The same from final hidden states [B, T, H] (HiddenStates); the fused path may reuse `hidden`'s
  // memory for its gradient, so `hidden` has no other use afterwards.
  torch::Tensor HeadLossSum(const torch::Tensor& hidden, const torch::Tensor& labels,
                            const torch::Tensor& loss_weights, const CrossEntropyOptions& options = {}) const;
  // HeadLossSum whose weights come from each chunk's own log-probabilities (ops::
  // fused_linear_cross_entropy_weighted_by: weights_of gets a chunk's -log p(label), tokens in row-major
  // order, chunks a multiple of chunk_multiple tokens), in one pass over the logits. Undefined when the op
  // table's head is the reference one, whose caller computes the log-probabilities first instead.
  torch::Tensor HeadLossSumWeightedBy(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      const ops::ChunkWeightsFn& weights_of, int64_t chunk_multiple) const;
  // Per-position log p(label) [B, T] fp32 (0 where ignored), no autograd, computed in chunks of
  // `chunk_tokens` positions (0: about 256 MB of fp32 logits per chunk).
  torch::Tensor TokenLogProbs(const torch::Tensor& input_ids, const torch::Tensor& labels,
                              int64_t chunk_tokens = 0) const;
  // The same from final hidden states [B, T, H] (not changed).
  torch::Tensor HeadLogProbs(const torch::Tensor& hidden, const torch::Tensor& labels, int64_t chunk_tokens = 0) const;

  // Hugging Face tensors by name (Phi3's fused qkv_proj/gate_up_proj as stored). Checks that every
  // parameter is present with its shape; converts dtype. Throws ModelError otherwise.
  void LoadStateDict(const std::map<std::string, torch::Tensor>& tensors);
  // name -> tensor, Hugging Face names (tied lm_head omitted, as save_pretrained does).
  std::map<std::string, torch::Tensor> StateDict() const;

 private:
  void AddParameter(const std::string& name, std::vector<int64_t> shape, const torch::TensorOptions& options);
  const torch::Tensor& param(const std::string& name) const;
  // Shape and dtype only (nothing that reads the values, which would wait for the device): the values'
  // range is the batch contract's (tigon::CheckBatch, engine.h), checked once where a batch enters the engine.
  void CheckTokenTensor(const torch::Tensor& ids, const char* what) const;
  // labels (and loss_weights when defined) of input_ids' shape; ModelError otherwise.
  void CheckTargets(const torch::Tensor& input_ids, const torch::Tensor& labels, const torch::Tensor& loss_weights) const;

  ModelConfig config_;
  OpTable ops_;
  std::vector<NamedParameter> params_;
  std::map<std::string, size_t> index_;
  torch::Tensor inv_freq_;        // RoPE inverse frequencies [rotary_dim / 2], fp32 on the CPU
  torch::Tensor local_inv_freq_;  // the sliding-window layers' own (undefined unless local_rope_theta > 0)
};

// A JSON file of a model folder (config.json, the shard index), read with the nesting and size bounds of
// common/bounded_json.h; ModelError naming the file when it cannot be read or parsed.
nlohmann::json ReadJsonFile(const std::string& path);

// Loads config.json and model.safetensors (or the shards of model.safetensors.index.json) from a local
// Hugging Face folder, into `dtype` on `device`. Throws ModelError naming the problem.
std::unique_ptr<DecoderModel> LoadPretrained(const std::string& folder, const OpTable* ops, torch::Dtype dtype,
                                             torch::Device device);

// A randomly initialised model from a Hugging Face config.
std::unique_ptr<DecoderModel> CreateRandom(const nlohmann::json& config, const OpTable* ops, uint64_t seed,
                                           torch::Dtype dtype, torch::Device device);

// Writes config.json and model.safetensors of `model` (in its current dtype) into `folder`.
void SavePretrained(const DecoderModel& model, const std::string& folder);
// The config.json text SavePretrained writes (the model's config with its current dtype).
std::string SavedConfigText(const DecoderModel& model);

// The model_types of the registered families (models/families/), sorted.
std::vector<std::string> SupportedFamilies();

}  // namespace tigon::models
