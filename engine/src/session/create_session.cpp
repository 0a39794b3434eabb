// CreateSession: the model's config read and checked, its memory estimated against the device before
// anything is allocated, the op table chosen, the weights loaded or initialised; one device here, several
// through data_parallel_session.cpp.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "checkpoint/checkpoint_files.h"
#include "common/bounded_json.h"
#include "models/model.h"
#include "parallel/replica.h"
#include "runtime/clock.h"
#include "runtime/device_memory.h"
#include "runtime/exception_status.h"
#include "runtime/log.h"
#include "session/flat_parameters.h"
#include "session/memory_estimate.h"
#include "session/single_device_session.h"
#include "tigon/data_parallel.h"
#include "tigon/engine.h"

namespace tigon {
namespace engine {
namespace {

models::OpChoice ParseChoice(const std::string& op, const std::string& value) {
  if (value == "fused") return models::OpChoice::kFused;
  if (value == "reference") return models::OpChoice::kReference;
  throw std::invalid_argument("kernel choice for '" + op + "' must be 'fused' or 'reference', got '" + value + "'");
}

}  // namespace

Status CreateReplicaSession(const SessionOptions& options, torch::Device device,
                            std::unique_ptr<ReplicaSession>* replica) {
  try {
    TIGON_RETURN_IF_ERROR(CheckSessionChoices(options));
    const Precision precision = ParsePrecision(options.precision);
    const bool has_path = !options.model_path.empty();
    const bool has_config = !options.config_json.empty();
    if (has_path == has_config)
      return Status(StatusCode::kInvalidArgument,
                    "give exactly one of a model path (a local Hugging Face folder) or a model config");

    nlohmann::json config_json;
    if (has_path) {
      if (!std::filesystem::is_directory(options.model_path))
        return Status(StatusCode::kNotFound, "model folder " + options.model_path + " does not exist");
      config_json = models::ReadJsonFile(options.model_path + "/config.json");
    } else {
      try {
        config_json = ParseBoundedJson(options.config_json);
      } catch (const JsonInputError& e) {
        return Status(StatusCode::kInvalidArgument, std::string("model config is not valid JSON: ") + e.what());
      }
    }
    auto config = models::ModelConfig::FromJson(config_json);
    TIGON_RETURN_IF_ERROR(
        CheckSessionFits(EstimateFootprint(config, precision, options.optimizer_in_backward), options, device));
    models::OpChoice default_choice = ParseChoice("kernels", options.kernels);
    auto table = default_choice == models::OpChoice::kFused ? models::OpTable::AllFused(config)
                                                              : models::OpTable::AllReference(config);
    for (const auto& [op, value] : options.kernel_overrides) table.Set(op, ParseChoice(op, value));

    c10::DeviceGuard guard(device);
    std::unique_ptr<models::DecoderModel> model;
    std::map<std::string, std::string> companion_files;
    const auto dtype = ModelDtype(precision);
    const auto start = Clock::now();
    if (has_path) {
      model = models::LoadPretrained(options.model_path, &table, dtype, device);
      companion_files = ReadCompanionFiles(options.model_path);
    } else {
      model = models::CreateRandom(config_json, &table, options.seed, dtype, device);
    }
    const double weights_seconds = SecondsSince(start);
    WarmUpMatmulLibraries(device, dtype);
    std::vector<int> devices;
    if (device.is_cuda()) devices = {static_cast<int>(device.index())};
    *replica = MakeSingleDeviceSession(std::move(model), precision, device, devices, options,
                                       std::move(companion_files));
    Logf(LogLevel::kInfo, "session on ", device.str(), ": weights ", has_path ? "loaded" : "initialised", " in ",
         weights_seconds, " s, buffers in ", SecondsSince(start) - weights_seconds, " s");
    return Status::Ok();
  } catch (const std::exception& e) {
    return StatusFromException(e, torch::Device(torch::kCPU), "create_session");
  }
}
}  // namespace engine

Status CreateSession(const SessionOptions& options, std::unique_ptr<Session>* session) {
  using namespace engine;
  if (session == nullptr) return Status(StatusCode::kInvalidArgument, "no output session given");
  // Several devices: one replica per device, gradients summed over NCCL (data_parallel_session.cpp).
  if (options.devices.size() > 1 && options.optimizer_in_backward)
    return Status(StatusCode::kInvalidArgument,
                  "optimizer_in_backward is for single-device sessions (data parallelism sums the whole gradient "
                  "buffer before the update)");
  if (options.devices.size() > 1) return CreateDataParallelSession(options, DataParallelOptions(), session);
  // One device: CUDA device 0 by default when present, else the CPU.
  torch::Device device(torch::kCPU);
  const auto available = ListDevices();
  int index = options.devices.empty() ? (available.empty() ? -1 : 0) : options.devices.front();
  if (!options.devices.empty() && (index < 0 || index >= static_cast<int>(available.size())))
    return Status(StatusCode::kInvalidArgument, "device " + std::to_string(index) + " does not exist (" +
                                                    std::to_string(available.size()) + " CUDA device(s) present)");
  if (index >= 0) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  std::unique_ptr<ReplicaSession> replica;
  TIGON_RETURN_IF_ERROR(CreateReplicaSession(options, device, &replica));
  const auto info = replica->Info();
  Logf(LogLevel::kInfo, "created session: ", info.model_family, " ", info.parameter_count, " parameters, ",
       options.precision, ", on ", device.str());
  *session = std::move(replica);
  return Status::Ok();
}

std::vector<std::string> SupportedModelFamilies() { return models::SupportedFamilies(); }

std::string EngineVersion() { return "0.1.0"; }

}  // namespace tigon

