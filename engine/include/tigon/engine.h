// Tigon's engine: sessions that hold a model replica, its optimizer state and a step counter, and run
// forward, backward and AdamW steps. This header is the whole contract with the server: it has no torch
// types, so that the server never compiles against torch's headers (see docs/ARCHITECTURE.md).
//
// Errors are values: every call returns a Status; torch and CUDA exceptions are caught inside the engine.
// A call that fails leaves the session as it was before the call.
#pragma once

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
};

// ---- batches and results ------------------------------------------------------------------------

// A packed batch, row-major [batch, seq_len].
struct Batch {
  int64_t batch = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;       // empty: input_ids shifted left by one, last position ignored
  std::vector<float> loss_weights;   // empty: 1 for every position
};

inline constexpr int32_t kIgnoreIndex = -100;

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
};

struct ForwardResult {
  double loss = 0.0;
  int64_t tokens = 0;
  std::vector<float> logprobs;  // [batch * seq_len]: log p(label) per position, 0 where ignored
};

struct OpSelection {
  std::string op;      // e.g. "rms_norm"
  std::string choice;  // "fused" | "reference"
};

struct SessionInfo {
  std::string model_family;  // "llama", "mistral", "qwen2", "gemma", "phi3"
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
};

// ---- sessions -----------------------------------------------------------------------------------

// Not thread-safe: the caller serialises calls on one session. Different sessions are independent.
class Session {
 public:
  virtual ~Session() = default;

  virtual SessionInfo Info() const = 0;

  // Forward and backward; gradients are added to those pending since the last optimizer step.
  virtual Status ForwardBackward(const Batch& batch, StepStats* stats) = 0;
  // AdamW over the pending gradients (normalised by the target tokens they came from), then clears them.
  virtual Status OptimStep(const OptimizerOverrides& overrides, StepStats* stats) = 0;
  // ForwardBackward + OptimStep in one call; on failure nothing is applied.
  virtual Status TrainStep(const Batch& batch, const OptimizerOverrides& overrides, StepStats* stats) = 0;
  // Loss and per-token log-probabilities, no gradients.
  virtual Status Forward(const Batch& batch, ForwardResult* result) = 0;
  // Drops the gradients pending since the last optimizer step; weights, optimizer state and step are
  // unchanged (the server calls it when a step's caller gave up before the update). A session that
  // cannot answers kFailedPrecondition, and the server then applies the step as before.
  virtual Status DiscardGradients() {
    return Status(StatusCode::kFailedPrecondition, "this session cannot drop pending gradients");
  }

  // A Hugging Face-loadable folder (config.json, model.safetensors) plus optimizer.safetensors and
  // trainer_state.json; written under a temporary name and renamed, so `dir` is either the old
  // checkpoint or the complete new one.
  virtual Status SaveCheckpoint(const std::string& dir) = 0;
  // Loads weights, and optimizer state and step when present. Fails without changing the session when
  // the checkpoint does not match the model.
  virtual Status LoadCheckpoint(const std::string& dir) = 0;
};

Status CreateSession(const SessionOptions& options, std::unique_ptr<Session>* session);

std::vector<DeviceInfo> ListDevices();
std::vector<std::string> SupportedModelFamilies();
std::string EngineVersion();

// The engine logs through this sink (the server connects it to spdlog). Default: stderr.
enum class LogLevel { kDebug, kInfo, kWarning, kError };
void SetLogSink(std::function<void(LogLevel, const std::string&)> sink);

}  // namespace tigon
