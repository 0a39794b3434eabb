// The engine's Session: a model replica on one device, its flat parameters/gradients/AdamW state, and the
// step counter. Every public call validates first, then runs inside a try block that turns torch and
// CUDA exceptions into Status values; a failed call leaves the session as it was.
#include <torch/torch.h>

#include <chrono>
#include <set>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <system_error>

#include "checkpoint/atomic_dir.h"
#include "checkpoint/checkpoint_files.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "objectives/objectives.h"
#include "parallel/replica.h"
#include "runtime/clock.h"
#include "runtime/device_memory.h"
#include "runtime/exception_status.h"
#include "runtime/log.h"
#include "session/flat_parameters.h"
#include "session/single_device_session.h"
#include "session/optimizer_in_backward.h"
#include "session/step_stats.h"
#include "tigon/data_parallel.h"
#include "tigon/engine.h"

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace tigon {
namespace engine {
namespace {

constexpr int kCheckpointFormat = 1;

void Synchronize(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
  (void)device;
#endif
}

// With the optimizer in backward, CUDA updates run on their own stream unless TIGON_OPTIMIZER_UPDATE_STREAM=0
// (kept for measuring the overlap; the results are the same either way).
bool UseUpdateStream() {
  const char* value = std::getenv("TIGON_OPTIMIZER_UPDATE_STREAM");
  return value == nullptr || std::string(value) != "0";
}

class SessionImpl final : public ReplicaSession {
 public:
  SessionImpl(std::unique_ptr<models::DecoderModel> model, Precision precision, torch::Device device,
              std::vector<int> devices, const SessionOptions& options,
              std::map<std::string, std::string> companion_files)
      : release_on_close_(device),
        model_(std::move(model)),
        device_(device),
        devices_(std::move(devices)),
        optimizer_(options.optimizer),
        seed_(options.seed),
        fused_adamw_(model_->ops().Get("adamw") == models::OpChoice::kFused),
        companion_files_(std::move(companion_files)),
        limits_{model_->config().vocab_size, model_->config().max_position_embeddings, 0} {
    // With the optimizer in backward the gradient buffer is only allocated if ForwardBackward is used.
    flat_ = std::make_unique<FlatParameters>(*model_, precision, /*allocate_grads=*/!options.optimizer_in_backward);
    if (options.optimizer_in_backward)
      in_backward_ = std::make_unique<OptimizerInBackward>(flat_.get(), UseUpdateStream());
  }

  SessionInfo Info() const override {
    SessionInfo info;
    const auto& cfg = model_->config();
    info.model_family = cfg.family;
    info.precision = PrecisionName(flat_->precision());
    info.parameter_count = flat_->numel();
    info.vocab_size = cfg.vocab_size;
    info.max_position_embeddings = cfg.max_position_embeddings;
    for (const auto& [op, choice] : model_->ops().entries())
      info.ops.push_back({op, choice == models::OpChoice::kFused ? "fused" : "reference"});
    info.devices = devices_;
    info.optimizer_in_backward = in_backward_ != nullptr;
    info.step = step_;
    info.accumulated_batches = pending_batches_;
    info.optimizer = optimizer_;
    info.seed = seed_;
    return info;
  }

  Status ForwardBackward(const Batch& batch, const CallContext& context, StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckNotBroken());
    TIGON_RETURN_IF_ERROR(CheckBatch(batch, limits_));
    TIGON_RETURN_IF_ERROR(context.Check("before the step started"));
    const bool first_of_step = pending_batches_ == 0;
    StepStats out;
    TIGON_RETURN_IF_ERROR(RunForwardBackward(batch, &out, "forward_backward"));
    // Gradients added to earlier pending ones cannot be taken back alone; the first ones can.
    if (first_of_step) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
    StampWallTime(start, &out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status OptimStep(const OptimizerOverrides& overrides, const CallContext& context, StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckNotBroken());
    if (pending_batches_ == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "optim_step needs accumulated gradients: call forward_backward first");
    }
    OptimizerSettings settings;
    TIGON_RETURN_IF_ERROR(ApplyOptimizerOverrides(optimizer_, overrides, &settings));
    TIGON_RETURN_IF_ERROR(context.Check("before the update"));
    ResetPeakMemory(device_);
    StepStats out;
    TIGON_RETURN_IF_ERROR(RunOptimStep(settings, &out));
    Synchronize(device_);
    StampWallTime(start, &out);
    FillMemory(&out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status TrainStep(const Batch& batch, const OptimizerOverrides& overrides, const CallContext& context,
                   StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckNotBroken());
    TIGON_RETURN_IF_ERROR(CheckBatch(batch, limits_));
    OptimizerSettings settings;
    TIGON_RETURN_IF_ERROR(ApplyOptimizerOverrides(optimizer_, overrides, &settings));
    TIGON_RETURN_IF_ERROR(context.Check("before the step started"));
    StepStats out;
    // Clipping needs the global norm before any update, and pending gradients must join this step.
    if (in_backward_ != nullptr && settings.max_grad_norm == 0 && pending_batches_ == 0) {
      TIGON_RETURN_IF_ERROR(RunTrainStepInBackward(batch, settings, &out));
      Synchronize(device_);
      StampWallTime(start, &out);
      FillMemory(&out);
      if (stats) *stats = out;
      return Status::Ok();
    }
    const bool joins_pending = pending_batches_ > 0;
    TIGON_RETURN_IF_ERROR(RunForwardBackward(batch, &out, "train_step"));
    if (!joins_pending) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
    StepStats update;
    TIGON_RETURN_IF_ERROR(RunOptimStep(settings, &update));
    Synchronize(device_);
    MergeUpdateStats(update, &out);
    StampWallTime(start, &out);
    FillMemory(&out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status Forward(const Batch& batch, const CallContext& context, ForwardResult* result) override {
    TIGON_RETURN_IF_ERROR(CheckNotBroken());
    TIGON_RETURN_IF_ERROR(CheckBatch(batch, limits_));
    TIGON_RETURN_IF_ERROR(context.Check("before the forward pass started"));
    return ForwardRows(batch, result);
  }

  Status ForwardRows(const Batch& batch, ForwardResult* result) override {
    try {
      c10::DeviceGuard guard(device_);
      torch::NoGradGuard no_grad;
      torch::Tensor logprobs;
      const ObjectivePass pass =
          EvaluateWithoutGradients(*model_, ObjectiveSettings(batch), ToBatchTensors(batch, device_), &logprobs);
      ForwardResult out;
      out.tokens = pass.tokens;
      out.loss = pass.count > 0 ? pass.loss_sum_value / static_cast<double>(pass.count) : 0.0;
      out.metrics = pass.metrics;
      auto flat = logprobs.to(torch::kFloat).reshape({-1}).contiguous().cpu();
      out.logprobs.assign(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
      if (result) *result = std::move(out);
      return Status::Ok();
    } catch (const std::exception& e) {
      return StatusFromException(e, device_, "forward");
    }
  }

  Status DiscardGradients() override {
    DropGradients();
    return Status::Ok();
  }

  Status SaveCheckpointAt(int parent_fd, const std::string& name, const std::string& label) override {
    if (name.empty()) return Status(StatusCode::kInvalidArgument, "checkpoint path is empty");
    TIGON_RETURN_IF_ERROR(CheckNotBroken());
    if (pending_batches_ > 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "the session has gradients from " + std::to_string(pending_batches_) +
                        " forward_backward call(s) not yet applied; call optim_step before saving");
    }
    try {
      CheckpointContents contents;
      contents.config_json = models::SavedConfigText(*model_);
      contents.model = model_->StateDict();
      contents.optimizer = {{"exp_avg", flat_->exp_avg()}, {"exp_avg_sq", flat_->exp_avg_sq()}};
      if (flat_->master().defined()) contents.optimizer["master"] = flat_->master();
      contents.optimizer_metadata = {{"format", "tigon-flat-adamw"}, {"step", std::to_string(step_)}};
      contents.tigon_state = TigonState().dump(1);
      contents.companion_files = companion_files_;
      WriteCheckpoint(parent_fd, name, contents);
      Logf(LogLevel::kInfo, "saved checkpoint at step ", step_, " to ", label);
      return Status::Ok();
    } catch (const std::system_error& e) {
      // A full disk is kResourceExhausted, a name held by a file kInvalidArgument (StatusCodeForErrno).
      return Status(StatusCodeForErrno(e.code().value()), "saving checkpoint " + label + " failed: " + e.what());
    } catch (const std::exception& e) {
      const Status status = StatusFromException(e, device_, "save_checkpoint");
      return Status(status.code() == StatusCode::kResourceExhausted ? status.code() : StatusCode::kInternal,
                    "saving checkpoint " + label + " failed: " + status.message());
    }
  }

  Status LoadCheckpointAt(int dir_fd, const std::string& dir) override {
    if (!RegularFileAt(dir_fd, "config.json"))
      return Status(StatusCode::kNotFound, "no config.json in checkpoint " + dir);
    try {
      c10::DeviceGuard guard(device_);
      // Read and check everything before touching the session.
      auto config = models::ModelConfig::FromJson(ReadJsonAt(dir_fd, "config.json", dir));
      const auto& mine = model_->config();
      if (config.family != mine.family || config.vocab_size != mine.vocab_size ||
          config.hidden_size != mine.hidden_size || config.num_hidden_layers != mine.num_hidden_layers ||
          config.intermediate_size != mine.intermediate_size ||
          config.num_attention_heads != mine.num_attention_heads ||
          config.num_key_value_heads != mine.num_key_value_heads) {
        return Status(StatusCode::kInvalidArgument,
                      "checkpoint " + dir + " holds a different model (" + config.family + ", hidden " +
                          std::to_string(config.hidden_size) + ", " + std::to_string(config.num_hidden_layers) +
                          " layers) than this session (" + mine.family + ", hidden " +
                          std::to_string(mine.hidden_size) + ", " + std::to_string(mine.num_hidden_layers) +
                          " layers)");
      }
      auto tensors = ReadModelTensorsAt(dir_fd, dir);
      std::map<std::string, torch::Tensor> optimizer;
      nlohmann::json state;  // tigon_state.json
      const bool has_optimizer = RegularFileAt(dir_fd, "optimizer.safetensors");
      if (has_optimizer) {
        optimizer = ReadSafetensorsAt(dir_fd, "optimizer.safetensors", dir);
        for (const char* key : {"exp_avg", "exp_avg_sq"}) {
          auto it = optimizer.find(key);
          if (it == optimizer.end() || it->second.numel() != flat_->numel())
            return Status(StatusCode::kInvalidArgument,
                          std::string("optimizer state '") + key + "' in " + dir +
                              " is missing or does not match this session's " +
                              std::to_string(flat_->numel()) + " parameters");
        }
        for (const char* file : {kTigonStateFile, kLegacyTigonStateFile}) {
          if (!RegularFileAt(dir_fd, file)) continue;
          state = ReadJsonAt(dir_fd, file, dir);
          break;
        }
      }
      for (const auto& slot : flat_->slots()) {
        auto it = tensors.find(slot.name);
        if (it == tensors.end())
          return Status(StatusCode::kInvalidArgument, "checkpoint " + dir + " lacks tensor " + slot.name);
        if (it->second.sizes().vec() != slot.shape)
          return Status(StatusCode::kInvalidArgument,
                        "tensor " + slot.name + " in " + dir + " has shape " + ShapeString(it->second.sizes().vec()) +
                            ", expected " + ShapeString(slot.shape));
      }
      // Apply.
      torch::NoGradGuard no_grad;
      for (const auto& slot : flat_->slots()) {
        flat_->params().narrow(0, slot.offset, slot.numel).copy_(tensors.at(slot.name).reshape({-1}));
      }
      flat_->ZeroGrads();
      pending_batches_ = 0;
      pending_count_ = 0;
      if (has_optimizer) {
        flat_->exp_avg().copy_(optimizer.at("exp_avg"));
        flat_->exp_avg_sq().copy_(optimizer.at("exp_avg_sq"));
        if (flat_->master().defined()) {
          auto it = optimizer.find("master");
          if (it != optimizer.end() && it->second.numel() == flat_->numel()) {
            flat_->master().copy_(it->second);
          } else {
            flat_->SyncMasterFromParams();
          }
        }
        step_ = state.value("step", int64_t{0});
      } else {
        flat_->ResetOptimizerState();
        step_ = 0;
      }
      broken_ = false;
      Logf(LogLevel::kInfo, "loaded checkpoint ", dir, " at step ", step_);
      return Status::Ok();
    } catch (const std::exception& e) {
      return StatusFromException(e, device_, "load_checkpoint");
    }
  }

  // ---- ReplicaSession: the data-parallel layer's view of this session (replica.h) ----
  torch::Device device() const override { return device_; }
  models::DecoderModel& model() override { return *model_; }
  FlatParameters& flat() override { return *flat_; }
  Status ForwardBackwardRows(const Batch& rows, StepStats* stats) override {
    return RunForwardBackward(rows, stats, "forward_backward");
  }
  int64_t pending_tokens() const override { return pending_count_; }
  void SetPendingTokens(int64_t tokens) override { pending_count_ = tokens; }
  void DropPendingGradients() override { DropGradients(); }
  void SetReportedDevices(std::vector<int> devices) override { devices_ = std::move(devices); }
  void SetFailureListener(std::function<void()> listener) override { failure_listener_ = std::move(listener); }

 private:
  static std::string ShapeString(const std::vector<int64_t>& shape) {
    std::ostringstream out;
    out << "[";
    for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
    out << "]";
    return out.str();
  }

  nlohmann::json TigonState() const {
    nlohmann::json state;
    state["format"] = kCheckpointFormat;
    state["step"] = step_;
    state["seed"] = seed_;
    state["precision"] = PrecisionName(flat_->precision());
    state["optimizer"] = {{"lr", optimizer_.lr},
                          {"beta1", optimizer_.beta1},
                          {"beta2", optimizer_.beta2},
                          {"eps", optimizer_.eps},
                          {"weight_decay", optimizer_.weight_decay},
                          {"max_grad_norm", optimizer_.max_grad_norm}};
    nlohmann::json layout = nlohmann::json::array();
    for (const auto& slot : flat_->slots()) layout.push_back({slot.name, slot.offset, slot.numel});
    state["flat_layout"] = layout;
    return state;
  }

  // The batch's objective, resolved (the batch passed CheckBatch, which resolved it once already).
  static objectives::Settings ObjectiveSettings(const Batch& batch) {
    objectives::Settings settings;
    const Status status = objectives::Resolve(batch.loss_fn, batch.loss_config, &settings);
    if (!status.ok()) throw std::invalid_argument(status.message());
    return settings;
  }

  Status RunForwardBackward(const Batch& batch, StepStats* out, const char* call) {
    try {
      c10::DeviceGuard guard(device_);
      ResetPeakMemory(device_);
      if (!flat_->has_grads()) flat_->AttachGrads();  // first accumulation with the optimizer in backward
      const ObjectivePass pass = ForwardObjective(*model_, ObjectiveSettings(batch), ToBatchTensors(batch, device_));
      // Rows of a data-parallel batch may hold no target token, and then their loss may have no graph.
      if (pass.loss_sum.requires_grad()) pass.loss_sum.backward();
      pending_batches_ += 1;
      pending_count_ += pass.count;
      out->loss = pass.count > 0 ? pass.loss_sum_value / static_cast<double>(pass.count) : 0.0;
      out->tokens = pass.tokens;
      out->metrics = pass.metrics;
      out->step = step_;
      out->accumulated_batches = pending_batches_;
      FillMemory(out);
      return Status::Ok();
    } catch (const std::exception& e) {
      // Other replicas may wait for this one in a collective: tell them first (releasing cached memory
      // below can wait for their devices).
      if (failure_listener_) failure_listener_();
      // Partial gradients of this call cannot be told apart from earlier ones: drop all pending ones.
      const int64_t dropped = pending_batches_;
      DropGradients();
      Status status = StatusFromException(e, device_, call);
      if (dropped > 0) {
        status = Status(status.code(), status.message() + " (gradients pending from " + std::to_string(dropped) +
                                           " earlier forward_backward call(s) were dropped too)");
      }
      Logf(LogLevel::kWarning, call, " failed: ", status.ToString());
      return status;
    }
  }

  Status RunOptimStep(const OptimizerSettings& settings, StepStats* out) {
    try {
      c10::DeviceGuard guard(device_);
      const double scale = 1.0 / static_cast<double>(std::max<int64_t>(pending_count_, 1));
      const double grad_norm = flat_->GradNorm(scale);
      if (!std::isfinite(grad_norm)) {
        DropGradients();
        return Status(StatusCode::kFailedPrecondition,
                      "gradient norm is not finite; the pending gradients were dropped and no update was applied");
      }
      double clip = 1.0;
      if (settings.max_grad_norm > 0 && grad_norm > settings.max_grad_norm)
        clip = settings.max_grad_norm / (grad_norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
      flat_->AdamWStep(NextAdamW(settings, scale * clip), fused_adamw_);
      step_ += 1;
      DropGradients();
      FillUpdate(grad_norm, settings, out);
      return Status::Ok();
    } catch (const std::exception& e) {
      // An update that failed part-way cannot be undone without a copy; report it as such.
      DropGradients();
      return StatusFromException(e, device_, "optim_step");
    }
  }

  // The statistics of an update just applied.
  void FillUpdate(double grad_norm, const OptimizerSettings& settings, StepStats* out) const {
    out->step = step_;
    out->grad_norm = grad_norm;
    out->lr = settings.lr;
    out->accumulated_batches = 0;
  }

  // The AdamW update of the next step (step_ + 1) with the gradients multiplied by grad_scale.
  AdamWOptions NextAdamW(const OptimizerSettings& settings, double grad_scale) const {
    AdamWOptions adamw;
    adamw.lr = settings.lr;
    adamw.beta1 = settings.beta1;
    adamw.beta2 = settings.beta2;
    adamw.eps = settings.eps;
    adamw.weight_decay = settings.weight_decay;
    adamw.step = step_ + 1;
    adamw.grad_scale = grad_scale;
    return adamw;
  }

  // TrainStep with AdamW applied to each parameter during backward (optimizer_in_backward.h). The same
  // update as RunForwardBackward + RunOptimStep without clipping, without ever holding all gradients.
  // A failure after the first update leaves a mix of old and new weights: the session is then broken
  // until a checkpoint is loaded.
  Status RunTrainStepInBackward(const Batch& batch, const OptimizerSettings& settings, StepStats* out) {
    int64_t updated = 0;
    try {
      c10::DeviceGuard guard(device_);
      ResetPeakMemory(device_);
      const ObjectivePass pass = ForwardObjective(*model_, ObjectiveSettings(batch), ToBatchTensors(batch, device_));
      const double scale = 1.0 / static_cast<double>(std::max<int64_t>(pass.count, 1));
      const torch::Tensor& loss_sum = pass.loss_sum;
      flat_->DetachGrads();
      in_backward_->Arm(NextAdamW(settings, scale), fused_adamw_);
      OptimizerInBackward::Result result;
      try {
        loss_sum.backward();
        result = in_backward_->Disarm(/*complete=*/true);
      } catch (...) {
        updated = in_backward_->Disarm(/*complete=*/false).updated;
        if (flat_->has_grads()) flat_->AttachGrads();
        throw;
      }
      if (flat_->has_grads()) flat_->AttachGrads();
      step_ += 1;
      const double grad_norm = std::sqrt(result.squared_norm) * scale;
      if (!std::isfinite(grad_norm)) {
        broken_ = true;
        return Status(StatusCode::kFailedPrecondition,
                      "the gradient norm of step " + std::to_string(step_) +
                          " is not finite and, with the optimizer in backward, it was already applied: " +
                          "the session is broken until a checkpoint is loaded");
      }
      out->loss = pass.loss_sum_value / static_cast<double>(std::max<int64_t>(pass.count, 1));
      out->tokens = pass.tokens;
      out->metrics = pass.metrics;
      FillUpdate(grad_norm, settings, out);
      return Status::Ok();
    } catch (const std::exception& e) {
      Status status = StatusFromException(e, device_, "train_step");
      if (updated > 0) {
        broken_ = true;
        status = Status(status.code(), status.message() + " (after " + std::to_string(updated) +
                                           " parameters were updated by the optimizer in backward: the session " +
                                           "is broken until a checkpoint is loaded)");
      }
      Logf(LogLevel::kWarning, "train_step failed: ", status.ToString());
      return status;
    }
  }

  Status CheckNotBroken() const {
    if (!broken_) return Status::Ok();
    return Status(StatusCode::kFailedPrecondition,
                  "this session is broken: a train_step failed after the optimizer in backward had updated part of "
                  "the model; load a checkpoint to continue");
  }

  // After the forward-backward pass of a step that started without pending gradients: a call no longer
  // wanted drops them and says so; nothing is applied.
  Status DropIfUnwanted(const CallContext& context) {
    Status wanted = context.Check("during the forward and backward pass");
    if (wanted.ok()) return wanted;
    DropGradients();
    Logf(LogLevel::kInfo, "the caller gave up during the forward and backward pass; its gradients were dropped, "
                          "no update applied");
    return wanted;
  }

 private:
  void DropGradients() {
    try {
      flat_->ZeroGrads();
    } catch (...) {
    }
    pending_batches_ = 0;
    pending_count_ = 0;
  }

  void FillMemory(StepStats* out) const {
    auto mem = ReadMemory(device_);
    out->peak_allocated_bytes = mem.peak_allocated;
    out->peak_reserved_bytes = mem.peak_reserved;
  }

  ReleaseMemoryOnDestruction release_on_close_;  // first: destroyed after every tensor below
  std::unique_ptr<models::DecoderModel> model_;
  std::unique_ptr<FlatParameters> flat_;
  std::unique_ptr<OptimizerInBackward> in_backward_;  // set when the session fuses AdamW into backward
  bool broken_ = false;                               // see RunTrainStepInBackward
  torch::Device device_;
  std::vector<int> devices_;
  OptimizerSettings optimizer_;
  uint64_t seed_;
  const bool fused_adamw_;  // the op table's "adamw" entry
  // The model folder's tokenizer and generation config, read at creation: every checkpoint gets a copy.
  std::map<std::string, std::string> companion_files_;
  BatchLimits limits_;  // what CheckBatch holds this session's batches to
  int64_t step_ = 0;
  int64_t pending_batches_ = 0;
  // What the pending gradients' losses are means over (target tokens for cross_entropy; engine.h's
  // objectives): the optimizer divides the gradients by it.
  int64_t pending_count_ = 0;
  std::function<void()> failure_listener_;  // data parallelism: see ReplicaSession
};


}  // namespace

std::unique_ptr<ReplicaSession> MakeSingleDeviceSession(std::unique_ptr<models::DecoderModel> model,
                                                        Precision precision, torch::Device device,
                                                        std::vector<int> devices, const SessionOptions& options,
                                                        std::map<std::string, std::string> companion_files) {
  return std::make_unique<SessionImpl>(std::move(model), precision, device, std::move(devices), options,
                                       std::move(companion_files));
}

}  // namespace engine
}  // namespace tigon
