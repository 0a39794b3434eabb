#include "server/validation.h"

#include "common/bounded_json.h"
#include "server/client_text.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "server/status_map.h"

namespace tigon::server {
namespace {

grpc::Status Invalid(const std::string& message) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message); }

bool SessionIdCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

grpc::Status ValidateBatchShape(int64_t rows, int64_t seq_len, const BatchLimits& limits) {
  return ToGrpcStatus(tigon::CheckBatchShape(rows, seq_len, limits));
}

grpc::Status ValidateBatch(const v1::Batch& batch, const BatchLimits& limits) {
  // The shape first, so that a batch over the limit is refused before its values are copied.
  grpc::Status shape = ValidateBatchShape(batch.batch(), batch.seq_len(), limits);
  if (!shape.ok()) return shape;
  return ToGrpcStatus(tigon::CheckBatch(ToEngineBatch(batch), limits));
}

grpc::Status ValidateSessionId(const std::string& session_id) {
  if (session_id.empty()) return Invalid("session_id is empty");
  if (session_id.size() > kMaxSessionIdBytes) {
    return Invalid("session_id is " + std::to_string(session_id.size()) + " bytes; the ids CreateSession returns are at "
                   "most " + std::to_string(kMaxSessionIdBytes));
  }
  for (char c : session_id) {
    if (!SessionIdCharacter(c)) {
      return Invalid("session_id '" + ClientText(session_id) +
                     "' is not a session id: ids hold only letters, digits, '.', '_' and '-'");
    }
  }
  return grpc::Status::OK;
}

grpc::Status ValidateRequestId(const std::string& request_id) {
  if (request_id.size() > kMaxRequestIdBytes) {
    return Invalid("request_id is " + std::to_string(request_id.size()) + " bytes, more than the " +
                   std::to_string(kMaxRequestIdBytes) + " allowed");
  }
  return grpc::Status::OK;
}

tigon::Batch ToEngineBatch(const v1::Batch& batch) {
  tigon::Batch out;
  out.batch = batch.batch();
  out.seq_len = batch.seq_len();
  out.input_ids.assign(batch.input_ids().begin(), batch.input_ids().end());
  out.labels.assign(batch.labels().begin(), batch.labels().end());
  out.loss_weights.assign(batch.loss_weights().begin(), batch.loss_weights().end());
  out.loss_fn = batch.loss_fn();
  const v1::LossConfig& c = batch.loss_config();
  tigon::LossConfig& config = out.loss_config;
  if (c.has_clip_low_threshold()) config.clip_low_threshold = c.clip_low_threshold();
  if (c.has_clip_high_threshold()) config.clip_high_threshold = c.clip_high_threshold();
  if (c.has_beta()) config.beta = c.beta();
  if (c.has_gamma()) config.gamma = c.gamma();
  if (c.has_label_smoothing()) config.label_smoothing = c.label_smoothing();
  if (c.has_z_loss()) config.z_loss = c.z_loss();
  if (c.has_cpo_alpha()) config.cpo_alpha = c.cpo_alpha();
  if (c.has_desirable_weight()) config.desirable_weight = c.desirable_weight();
  if (c.has_undesirable_weight()) config.undesirable_weight = c.undesirable_weight();
  config.loss_type = c.loss_type();
  out.sampler_logprobs.assign(batch.sampler_logprobs().begin(), batch.sampler_logprobs().end());
  out.advantages.assign(batch.advantages().begin(), batch.advantages().end());
  out.reference_logprobs.assign(batch.reference_logprobs().begin(), batch.reference_logprobs().end());
  out.desirable.assign(batch.desirable().begin(), batch.desirable().end());
  return out;
}

grpc::Status ValidateOptimizerSettings(const v1::OptimizerSettings& settings) {
  // The defaults pass, so a refusal names a field the request set.
  return ToGrpcStatus(tigon::ApplyOptimizerOverrides(tigon::OptimizerSettings(), ToEngineOverrides(settings), nullptr));
}

tigon::OptimizerOverrides ToEngineOverrides(const v1::OptimizerSettings& s) {
  tigon::OptimizerOverrides out;
  if (s.has_lr()) out.lr = s.lr();
  if (s.has_beta1()) out.beta1 = s.beta1();
  if (s.has_beta2()) out.beta2 = s.beta2();
  if (s.has_eps()) out.eps = s.eps();
  if (s.has_weight_decay()) out.weight_decay = s.weight_decay();
  if (s.has_max_grad_norm()) out.max_grad_norm = s.max_grad_norm();
  return out;
}

grpc::Status ValidateCreateSession(const v1::CreateSessionRequest& request,
                                   const std::vector<std::string>& model_families, int device_count,
                                   tigon::SessionOptions* options, int64_t max_parameters,
                                   const ModelFolder* model_folder) {
  switch (request.model_case()) {
    case v1::CreateSessionRequest::kConfigJson: {
      std::string error;
      nlohmann::json config = ParseBoundedJsonOrDiscard(request.config_json(), &error);
      if (config.is_discarded()) return Invalid("config_json is not valid JSON: " + ClientText(error));
      if (!config.is_object()) return Invalid("config_json is not a JSON object");
      auto model_type = config.find("model_type");
      if (model_type == config.end() || !model_type->is_string()) {
        return Invalid("config_json has no \"model_type\" string (e.g. \"llama\")");
      }
      const std::string family = model_type->get<std::string>();
      bool supported = false;
      for (const auto& f : model_families) supported |= (f == family);
      if (!supported) {
        return Invalid("model_type \"" + ClientText(family) + "\" is not supported; supported: " + Join(model_families));
      }
      options->config_json = request.config_json();
      break;
    }
    case v1::CreateSessionRequest::kModelPath: {
      // The folder was resolved inside the model roots and its config.json read (with a size cap) by
      // ModelRoots::Resolve; nothing of the file is echoed back, it is the server's, not the caller's.
      if (model_folder == nullptr || model_folder->path.empty()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "model_path was not resolved by the server");
      }
      const nlohmann::json config = ParseBoundedJsonOrDiscard(model_folder->config_json);
      if (config.is_discarded() || !config.is_object() || !config.contains("model_type") ||
          !config["model_type"].is_string()) {
        return Invalid("the model's config.json is not a JSON object with a \"model_type\" string");
      }
      bool supported = false;
      for (const auto& f : model_families) supported |= (f == config["model_type"].get<std::string>());
      if (!supported) {
        return Invalid("the model's config.json has a model_type this server does not train; supported: " +
                       Join(model_families));
      }
      options->model_path = model_folder->path;
      break;
    }
    case v1::CreateSessionRequest::MODEL_NOT_SET:
      return Invalid(
          "set the model: either config_json (a Hugging Face config with model_type) "
          "or model_path (a local Hugging Face folder)");
  }
  options->max_parameters = max_parameters;
  options->precision = request.precision().empty() ? "bf16" : request.precision();
  options->kernels = request.kernels().empty() ? "fused" : request.kernels();
  for (const auto& [op, choice] : request.kernel_overrides()) options->kernel_overrides[op] = choice;
  grpc::Status status = ToGrpcStatus(tigon::ApplyOptimizerOverrides(
      options->optimizer, ToEngineOverrides(request.optimizer()), &options->optimizer));
  if (!status.ok()) return status;
  status = ToGrpcStatus(tigon::CheckSessionChoices(*options));
  if (!status.ok()) return status;
  options->seed = request.seed();
  options->optimizer_in_backward = request.optimizer_in_backward();
  std::set<int> seen;
  for (int device : request.devices()) {
    if (device < 0 || device >= device_count) {
      std::ostringstream out;
      if (device_count == 0) {
        out << "device " << device << " does not exist: this server has no CUDA devices (leave "
            << "devices empty to run on the CPU)";
      } else {
        out << "device " << device << " does not exist: this server has CUDA devices 0.." << device_count - 1;
      }
      return Invalid(out.str());
    }
    if (!seen.insert(device).second) {
      return Invalid("device " + std::to_string(device) + " is listed twice");
    }
    options->devices.push_back(device);
  }
  return grpc::Status::OK;
}

grpc::Status ValidateWorldRank(const v1::CreateSessionRequest& request, int device_count, WorldRank* world) {
  *world = WorldRank();
  if (!request.has_world()) return grpc::Status::OK;
  const auto& w = request.world();
  if (w.world_size() < 2 || w.world_size() > kMaxWorldSize) {
    return Invalid("world.world_size is " + std::to_string(w.world_size()) + "; a session over several servers has 2.." +
                   std::to_string(kMaxWorldSize) + " ranks");
  }
  if (w.rank() < 0 || w.rank() >= w.world_size()) {
    return Invalid("world.rank " + std::to_string(w.rank()) + " is outside 0.." + std::to_string(w.world_size() - 1));
  }
  if (w.communicator_id().size() != kCommunicatorIdBytes) {
    return Invalid("world.communicator_id has " + std::to_string(w.communicator_id().size()) + " bytes; it must be the " +
                   std::to_string(kCommunicatorIdBytes) + " bytes NewCommunicatorId returned");
  }
  if (device_count == 0) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "a rank of a session over several servers needs a CUDA device; this server has none");
  }
  if (request.devices_size() > 1) {
    return Invalid("a rank of a session over several servers drives one CUDA device; " +
                   std::to_string(request.devices_size()) + " were given");
  }
  if (request.optimizer_in_backward()) {
    return Invalid("optimizer_in_backward cannot be combined with world: the update needs every rank's gradients");
  }
  const double timeout = w.collective_timeout_seconds();
  if (!std::isfinite(timeout) || timeout < 0 || timeout > kMaxCollectiveTimeoutSeconds) {
    return Invalid("world.collective_timeout_seconds must be in [0, " +
                   std::to_string(static_cast<int>(kMaxCollectiveTimeoutSeconds)) + "] (0: the default)");
  }
  world->collective_timeout_seconds = timeout;
  world->world_size = w.world_size();
  world->rank = w.rank();
  world->communicator_id = w.communicator_id();
  return grpc::Status::OK;
}

}  // namespace tigon::server
