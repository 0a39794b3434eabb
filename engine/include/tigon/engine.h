// Tigon's engine: sessions that hold a model replica, its optimizer state and a step counter, and run
// forward, backward and AdamW steps. This header is the whole contract with the server: it has no torch
// types, so that the server never compiles against torch's headers (see docs/ARCHITECTURE.md).
//
// Errors are values: every call returns a Status; torch and CUDA exceptions are caught inside the engine.
// A call that fails leaves the session as it was before the call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tigon {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kResourceExhausted,   // device out of memory (the message says so)
  kFailedPrecondition,  // e.g. an optimizer step with no accumulated gradients
  kDeadlineExceeded,
  kCancelled,
  kInternal,
  kUnavailable,
};

const char* StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define TIGON_RETURN_IF_ERROR(expr)            \
  do {                                         \
    ::tigon::Status _tigon_status = (expr);    \
    if (!_tigon_status.ok()) return _tigon_status; \
  } while (0)

// ---- options -------------------------------------------------------------------------------------

struct OptimizerSettings {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;  // global-norm clipping; 0 disables it
};

// Per-call changes to the session's optimizer settings; unset fields keep the session's value.
struct OptimizerOverrides {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, max_grad_norm;
};

// The one check of optimizer settings (CreateSession, every step, and the server before any lock):
// lr >= 0, beta1 and beta2 in [0, 1), eps > 0, weight_decay >= 0, max_grad_norm >= 0 (0: no clipping), all
// finite. kInvalidArgument naming the field and its value.
Status CheckOptimizerSettings(const OptimizerSettings& settings);
// `base` with the overrides that are set applied, then checked; `out` is written only when they pass.
Status ApplyOptimizerOverrides(const OptimizerSettings& base, const OptimizerOverrides& overrides,
                               OptimizerSettings* out);

// The names SessionOptions.precision and SessionOptions.kernels (and kernel_overrides' values) take.
inline constexpr const char* kPrecisionNames[] = {"fp32", "bf16", "bf16_mixed"};
inline constexpr const char* kKernelChoices[] = {"fused", "reference"};

// The files of a Hugging Face model folder besides config.json and the weights that make an exported
// folder usable on its own (tokenize, generate): a session created from a model folder reads those
// present and writes them into every checkpoint it saves.
inline constexpr const char* kModelFolderCompanionFiles[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "merges.txt",
    "chat_template.jinja", "chat_template.json"};

struct SessionOptions {
  // The model: either a local Hugging Face folder (config.json + safetensors) ...
  std::string model_path;
  // ... or a Hugging Face config as JSON text (with "model_type"), randomly initialised from `seed`.
  std::string config_json;
  std::string precision = "bf16";  // "fp32" | "bf16" | "bf16_mixed"
  std::string kernels = "fused";   // "fused" | "reference": the default for every op
  std::map<std::string, std::string> kernel_overrides;  // op name -> "fused" | "reference"
  OptimizerSettings optimizer;
  uint64_t seed = 0;
  std::vector<int> devices;  // CUDA device indices; empty = CUDA device 0 when there is one, else CPU
  // AdamW applied to each parameter as soon as backward has its gradient, which is then freed: TrainStep
  // never holds the whole gradient buffer (2 bytes per parameter in bf16). Same result as the ordinary
  // step; not with clipping (max_grad_norm > 0 takes the ordinary path) nor with several devices. A
  // TrainStep that fails after the first update leaves the session broken (kFailedPrecondition) until a
  // checkpoint is loaded.
  bool optimizer_in_backward = false;
  // > 0: a model with more parameters is refused (kResourceExhausted) before anything is allocated. Every
  // session is also refused when its estimated footprint (weights, gradients, optimizer state and the
  // activations of a 4,096-token step) is more than its device has available.
  int64_t max_parameters = 0;
};

// The checks of SessionOptions that need no model (CreateSession makes them first; the server before it
// calls the engine): precision and kernels among the names above, every kernel override a non-empty op
// name with a choice above, the optimizer settings. Which op names exist is the model's to say.
Status CheckSessionChoices(const SessionOptions& options);

// ---- batches and results ------------------------------------------------------------------------

// ---- objectives ---------------------------------------------------------------------------------
//
// What a step minimises. Every objective is a function of lp = log p(label) at the batch's target tokens
// (labels != -100). Its gradient reaches the model through the fused LM head as one coefficient per
// token, dL/dlp, so no objective materialises [tokens, vocab] logits. A step's loss is loss_sum / count
// and the optimizer divides the gradients pending since the last update by the sum of their counts.
// r = exp(lp - sampler_lp) is the importance ratio; sums and means below are over a row's target tokens.
//
//   cross_entropy        -w lp (w = loss_weights >= 0; label_smoothing, z_loss); count: target tokens
//   linear               -w lp with weights of any sign; count 1. The gradient of any loss the client can
//                        differentiate with respect to lp: w = -dL/dlp (forward_backward_custom)
//   importance_sampling  -w r A (A = advantages); count: target tokens
//   ppo                  -w min(r A, clip(r, clip_low_threshold, clip_high_threshold) A); thresholds 0.8, 1.2
//   cispo                -w sg(clip(r, clip_low_threshold, clip_high_threshold)) A lp; thresholds 0, 4
//   Rows pair up (chosen, rejected) = rows (0, 1), (2, 3), ...; count: pairs. h below is a margin.
//   dpo                  loss_type "sigmoid": -(1-e) logsig(beta h) - e logsig(-beta h) (e = label_smoothing),
//                        "ipo": (h - 1/(2 beta))^2 over per-token means, "hinge": relu(1 - beta h);
//                        h = (sum lp - sum ref_lp)_chosen - (sum lp - sum ref_lp)_rejected; beta 0.1
//   simpo                -(1-e) logsig(beta h - gamma) - e logsig(gamma - beta h), h = mean lp_chosen -
//                        mean lp_rejected; no reference; beta 2, gamma 1
//   cpo                  as dpo's sigmoid without the reference, h = sum lp_chosen - sum lp_rejected, plus
//                        cpo_alpha (1) times the chosen rows' mean -lp; beta 0.1
//   orpo                 the chosen rows' mean -lp - beta logsig(log odds(mean lp_chosen) - log odds(mean
//                        lp_rejected)), log odds(x) = x - log(1 - exp(x)); beta 0.1
//   kto                  rows labelled desirable or not; count: rows. z = max(0, mean over rows of (sum lp -
//                        sum ref_lp)), held constant; desirable: desirable_weight (1 - sig(beta (d - z))),
//                        undesirable: undesirable_weight (1 - sig(beta (z - d))), d = sum lp - sum ref_lp;
//                        beta 0.1. (z is estimated from the batch's own rows, not from mismatched pairs.)
// Figures (StepStats::metrics): importance_sampling, ppo, cispo: ratio_mean, sampler_kl (mean of
// sampler_lp - lp), and clip_fraction (ppo: tokens whose clipped term is the smaller; cispo: tokens whose
// ratio was clipped); the pair objectives: rewards_chosen, rewards_rejected, reward_margin, reward_accuracy
// (rewards: beta times the margin's terms per row), cpo and orpo also nll, orpo log_odds_ratio; kto: kl
// (z), rewards_desirable, rewards_undesirable.
inline constexpr const char* kObjectiveNames[] = {"cross_entropy", "linear", "importance_sampling", "ppo", "cispo",
                                                  "dpo", "simpo", "cpo", "orpo", "kto"};
inline constexpr const char* kDpoLossTypes[] = {"sigmoid", "ipo", "hinge"};

// An objective's settings; unset fields take the objective's defaults above. A field the objective
// does not use is refused (kInvalidArgument), so that a typo does not go unnoticed.
struct LossConfig {
  std::optional<double> clip_low_threshold, clip_high_threshold;  // ppo, cispo: bounds of the ratio
  std::optional<double> beta;                                     // the preference objectives, kto
  std::optional<double> gamma;                                    // simpo: the target margin
  std::optional<double> label_smoothing;  // cross_entropy: over the vocabulary; dpo (sigmoid), simpo, cpo
  std::optional<double> z_loss;           // cross_entropy: z_loss * logsumexp^2 per token
  std::optional<double> cpo_alpha;        // cpo: weight of the chosen rows' cross-entropy
  std::optional<double> desirable_weight, undesirable_weight;  // kto
  std::string loss_type;                  // dpo: "sigmoid" (empty), "ipo" or "hinge"
};

// A packed batch, row-major [batch, seq_len], and what its step minimises.
struct Batch {
  int64_t batch = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;       // empty: input_ids shifted left by one, last position ignored
  std::vector<float> loss_weights;   // empty: 1 for every position
  std::string loss_fn;               // one of kObjectiveNames; empty: "cross_entropy"
  LossConfig loss_config;
  // Per position, [batch * seq_len], read at target positions only; empty unless loss_fn uses them:
  std::vector<float> sampler_logprobs;    // importance_sampling, ppo, cispo: log q(label) of the sampler
  std::vector<float> advantages;          // importance_sampling, ppo, cispo
  std::vector<float> reference_logprobs;  // dpo, kto: log p_ref(label), as Forward returns them
  std::vector<uint8_t> desirable;         // kto: per row, 1 desirable, 0 undesirable
};

// The objective's name ("cross_entropy" for an empty loss_fn).
inline std::string ObjectiveName(const Batch& batch) {
  return batch.loss_fn.empty() ? std::string("cross_entropy") : batch.loss_fn;
}

inline constexpr int32_t kIgnoreIndex = -100;

struct SessionInfo;

// What a batch is checked against: the session's model and, in the server, its request limit.
struct BatchLimits {
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;  // 0: no limit from the model
  int64_t max_batch_tokens = 0;         // 0: no limit (the server passes --max-batch-tokens)
};
BatchLimits BatchLimitsOf(const SessionInfo& info);

// The one batch contract. The server checks every batch with it before it takes any lock, and every
// Session call checks its batch with it once, at the engine's boundary; the layers below only assert.
//  - batch and seq_len positive; batch * seq_len <= max_batch_tokens when that is set (kResourceExhausted);
//  - seq_len <= max_position_embeddings when the model sets it: longer sequences are refused everywhere
//    (tigon-train and the service alike). Rotary embeddings would run past it, but the model was not
//    trained there and its rope scaling is defined up to it; a longer context is a config change
//    (raise max_position_embeddings, with the rope scaling meant for it), not a per-batch surprise;
//  - input_ids, and labels/loss_weights when given, hold batch * seq_len values;
//  - ids in [0, vocab_size), labels in [0, vocab_size) or kIgnoreIndex, weights finite and >= 0;
//  - at least one target token (a label that is not kIgnoreIndex, or any position but each row's last
//    with the default labels) with a positive weight: the loss is a mean over them;
//  - the objective (see above): loss_fn a known name, its settings in range and only those it uses; the
//    per-position inputs it needs present, finite, and no others; weights of any sign for "linear" only,
//    none for the pair and kto objectives; for those, an even number of rows (pairs), each row with at
//    least one target token, and kto's desirable flags 0 or 1, one per row.
// Messages name the field and the [row][column] of the first bad value. kInvalidArgument otherwise.
Status CheckBatchShape(int64_t rows, int64_t seq_len, const BatchLimits& limits);
Status CheckBatch(const Batch& batch, const BatchLimits& limits);

// What a session spread over several devices (whose ranks hold different rows) also requires of a batch:
// an objective whose rows are independent and whose count is their target tokens (cross_entropy,
// importance_sampling, ppo, cispo); kInvalidArgument saying so otherwise.
Status CheckObjectiveSplitsOverRows(const Batch& batch);

// What the caller of a call still wants. The engine looks at it when a step starts and again between
// the forward-backward pass and the optimizer update; a call no longer wanted returns kDeadlineExceeded or
// kCancelled and applies nothing (its gradients are dropped). Exceptions, where the step goes on: a
// TrainStep that joins gradients pending from earlier ForwardBackward calls (they cannot be told apart
// from its own), the optimizer in backward (the update runs inside backward), and a rank of a session
// over several processes once its gradients are summed with the other ranks' (they apply them).
struct CallContext {
  std::function<bool()> cancelled;  // empty: never cancelled
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  // OK while the call is wanted, else kDeadlineExceeded or kCancelled saying so `when` ("before the step
  // started") and that nothing was applied.
  Status Check(const char* when) const;
};

struct StepStats {
  int64_t step = 0;           // optimizer steps taken so far (after this call)
  double loss = 0.0;          // mean loss per target token of this call's batch (weighted)
  int64_t tokens = 0;         // target tokens (labels != -100) in this call's batch
  double grad_norm = 0.0;     // global gradient norm before clipping (optimizer steps)
  double lr = 0.0;            // learning rate used (optimizer steps)
  double wall_seconds = 0.0;  // time inside the engine for this call
  double tokens_per_second = 0.0;
  int64_t peak_allocated_bytes = 0;  // device memory during this call (CPU: 0)
  int64_t peak_reserved_bytes = 0;
  int64_t accumulated_batches = 0;   // forward-backward calls whose gradients are pending
  // The objective's own figures for this call's batch: e.g. the clipped
  // fraction and mean ratio of ppo, the rewards, margin and accuracy of dpo. Empty for cross_entropy.
  std::map<std::string, double> metrics;
};

struct ForwardResult {
  double loss = 0.0;  // the batch's objective, as a step would report it
  int64_t tokens = 0;
  std::vector<float> logprobs;  // [batch * seq_len]: log p(label) per position, 0 where ignored
  std::map<std::string, double> metrics;  // as StepStats::metrics
};

struct OpSelection {
  std::string op;      // e.g. "rms_norm"
  std::string choice;  // "fused" | "reference"
};

struct SessionInfo {
  std::string model_family;  // config.json's model_type, one of SupportedModelFamilies()
  std::string precision;
  int64_t parameter_count = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  std::vector<OpSelection> ops;
  std::vector<int> devices;
  bool optimizer_in_backward = false;
  int64_t step = 0;
  int64_t accumulated_batches = 0;
  OptimizerSettings optimizer;
  uint64_t seed = 0;
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  // This process's caching allocator on the device: held by tensors, and held in all (cached blocks
  // included; the driver counts them as used until they are released, as CloseSession does).
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
};

// ---- sessions -----------------------------------------------------------------------------------

// Not thread-safe: the caller serialises calls on one session. Different sessions are independent.
class Session {
 public:
  virtual ~Session() = default;

  virtual SessionInfo Info() const = 0;

  // Forward and backward; gradients are added to those pending since the last optimizer step. A context
  // no longer wanted after the pass drops this call's gradients when no earlier ones were pending.
  virtual Status ForwardBackward(const Batch& batch, const CallContext& context, StepStats* stats) = 0;
  // AdamW over the pending gradients (normalised by the target tokens they came from), then clears them.
  virtual Status OptimStep(const OptimizerOverrides& overrides, const CallContext& context, StepStats* stats) = 0;
  // ForwardBackward + OptimStep in one call; on failure, or a context no longer wanted before the update
  // (CallContext says when), nothing is applied.
  virtual Status TrainStep(const Batch& batch, const OptimizerOverrides& overrides, const CallContext& context,
                           StepStats* stats) = 0;
  // Loss and per-token log-probabilities, no gradients.
  virtual Status Forward(const Batch& batch, const CallContext& context, ForwardResult* result) = 0;
  // The same calls for a caller that never gives up.
  Status ForwardBackward(const Batch& batch, StepStats* stats) { return ForwardBackward(batch, CallContext(), stats); }
  Status OptimStep(const OptimizerOverrides& overrides, StepStats* stats) {
    return OptimStep(overrides, CallContext(), stats);
  }
  Status TrainStep(const Batch& batch, const OptimizerOverrides& overrides, StepStats* stats) {
    return TrainStep(batch, overrides, CallContext(), stats);
  }
  Status Forward(const Batch& batch, ForwardResult* result) { return Forward(batch, CallContext(), result); }
  // Drops the gradients pending since the last optimizer step; weights, optimizer state and step are
  // unchanged.
  virtual Status DiscardGradients() = 0;

  // A Hugging Face-loadable folder (config.json, model.safetensors) plus optimizer.safetensors and
  // tigon_state.json (step, seed, optimizer settings; not Hugging Face Trainer's trainer_state.json) and,
  // for a session created from a model folder, that folder's generation_config.json and tokenizer files,
  // as read when the session was created; named `name` (one path component) inside the folder open as `parent_fd`; written
  // into a temporary folder beside it and swapped in, so `name` is either the old checkpoint or the
  // complete new one. Every file is created through descriptors held for the whole save, never through
  // a path looked up again, so a symbolic link swapped in meanwhile cannot send it elsewhere. `label`
  // names the checkpoint in messages. A full disk is kResourceExhausted.
  virtual Status SaveCheckpointAt(int parent_fd, const std::string& name, const std::string& label) = 0;
  // Loads weights, and optimizer state and step when present, from the folder open as `dir_fd` (the step
  // from tigon_state.json, or from trainer_state.json in checkpoints written before the rename); its
  // files are opened relative to it and never through a link. Fails without changing the session when
  // the checkpoint does not match the model.
  virtual Status LoadCheckpointAt(int dir_fd, const std::string& label) = 0;
  // The same by path: `dir`'s parent folders are created when missing.
  Status SaveCheckpoint(const std::string& dir);
  Status LoadCheckpoint(const std::string& dir);
};

Status CreateSession(const SessionOptions& options, std::unique_ptr<Session>* session);

std::vector<DeviceInfo> ListDevices();
std::vector<std::string> SupportedModelFamilies();  // the model_types the engine can build, sorted
std::string EngineVersion();

// The engine logs through this sink (the server connects it to spdlog). Default: stderr.
enum class LogLevel { kDebug, kInfo, kWarning, kError };
void SetLogSink(std::function<void(LogLevel, const std::string&)> sink);

}  // namespace tigon
