// Hugging Face folders: config.json + model.safetensors, or the shards listed by
// model.safetensors.index.json; random initialisation; save_pretrained-compatible writing.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "models/model.h"
#include "models/safetensors.h"
#include "common/bounded_json.h"

namespace tigon::models {
namespace {

namespace fs = std::filesystem;

void CheckParameterDtype(torch::Dtype dtype) {
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16) {
    throw ModelError("model dtype must be float32, bfloat16 or float16, not " + std::string(c10::toString(dtype)));
  }
}

const char* HuggingFaceDtypeName(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return "float32";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kFloat16:
      return "float16";
    default:
      throw ModelError("no Hugging Face name for dtype " + std::string(c10::toString(dtype)));
  }
}

// Shard names come from a file we do not trust: keep them inside the folder.
fs::path ShardPath(const fs::path& folder, const fs::path& index_path, const std::string& shard) {
  const fs::path relative(shard);
  if (shard.empty() || relative.is_absolute() || relative.lexically_normal().string().rfind("..", 0) == 0) {
    throw ModelError(index_path.string() + ": shard file name '" + shard +
                     "' must be a relative path inside the folder");
  }
  return folder / relative;
}

// The tensors in `needed` (the model's parameters); shards that hold none of them are not opened.
std::map<std::string, torch::Tensor> ReadShardedCheckpoint(const fs::path& folder, const fs::path& index_path,
                                                           const std::set<std::string>& needed) {
  const nlohmann::json index = ReadJsonFile(index_path.string());
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw ModelError(index_path.string() + ": missing or invalid 'weight_map' object");
  }
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      throw ModelError(index_path.string() + ": weight_map entry '" + name + "' must name a shard file");
    }
    if (needed.count(name) != 0) names_by_shard[shard.get<std::string>()].push_back(name);
  }
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [shard, names] : names_by_shard) {
    const fs::path shard_path = ShardPath(folder, index_path, shard);
    if (!fs::exists(shard_path)) {
      throw ModelError(index_path.string() + ": shard '" + shard + "' (listed for tensor '" + names.front() +
                       "') does not exist");
    }
    std::map<std::string, torch::Tensor> shard_tensors =
        ReadSafetensors(shard_path.string(), std::set<std::string>(names.begin(), names.end()));
    for (const auto& name : names) {
      auto it = shard_tensors.find(name);
      if (it == shard_tensors.end()) {
        throw ModelError(shard_path.string() + ": does not contain tensor '" + name + "' that " +
                         index_path.filename().string() + " maps to it");
      }
      tensors[name] = std::move(it->second);
    }
  }
  return tensors;
}

// Writes through a temporary name and renames, so a crash never leaves a half-written file in place.
void WriteTextAtomically(const fs::path& path, const std::string& text) {
  const fs::path temp = path.string() + ".tmp";
  {
    std::ofstream file(temp, std::ios::binary | std::ios::trunc);
    if (!file) throw ModelError(temp.string() + ": cannot open for writing");
    file << text;
    file.flush();
    if (!file) throw ModelError(temp.string() + ": write failed");
  }
  std::error_code error;
  fs::rename(temp, path, error);
  if (error) throw ModelError(path.string() + ": rename failed: " + error.message());
}

}  // namespace

nlohmann::json ReadJsonFile(const std::string& path) {
  try {
    return ReadBoundedJsonFile(path);
  } catch (const JsonInputError& e) {
    throw ModelError(e.what());
  }
}

std::unique_ptr<DecoderModel> LoadPretrained(const std::string& folder_name, const OpTable* ops, torch::Dtype dtype,
                                             torch::Device device) {
  CheckParameterDtype(dtype);
  const fs::path folder(folder_name);
  if (!fs::is_directory(folder)) throw ModelError(folder_name + ": not a directory");
  const fs::path config_path = folder / "config.json";
  if (!fs::exists(config_path)) throw ModelError(folder_name + ": no config.json");
  ModelConfig config;
  try {
    config = ModelConfig::FromJson(ReadJsonFile(config_path.string()));
  } catch (const ModelError& e) {
    const std::string message = e.what();
    // ReadJsonFile already names the file; FromJson's messages get it prefixed.
    if (message.rfind(config_path.string(), 0) == 0) throw;
    throw ModelError(config_path.string() + ": " + message);
  }
  const OpTable table = ops != nullptr ? *ops : OpTable::AllFused(config);
  auto model = std::make_unique<DecoderModel>(config, table, torch::TensorOptions().dtype(dtype).device(device));

  const fs::path single = folder / "model.safetensors";
  const fs::path index = folder / "model.safetensors.index.json";
  // Only the model's own parameters are read: other tensors of the files are never allocated.
  std::set<std::string> needed;
  for (const auto& [name, tensor] : model->StateDict()) needed.insert(name);
  std::map<std::string, torch::Tensor> tensors;
  std::string source;
  if (fs::exists(single)) {
    tensors = ReadSafetensors(single.string(), needed);
    source = single.string();
  } else if (fs::exists(index)) {
    tensors = ReadShardedCheckpoint(folder, index, needed);
    source = index.string();
  } else {
    throw ModelError(folder_name + ": no model.safetensors or model.safetensors.index.json");
  }
  try {
    model->LoadStateDict(tensors);
  } catch (const ModelError& e) {
    throw ModelError(source + ": " + e.what());
  }
  return model;
}

std::unique_ptr<DecoderModel> CreateRandom(const nlohmann::json& config_json, const OpTable* ops, uint64_t seed,
                                           torch::Dtype dtype, torch::Device device) {
  CheckParameterDtype(dtype);
  const ModelConfig config = ModelConfig::FromJson(config_json);
  const OpTable table = ops != nullptr ? *ops : OpTable::AllFused(config);
  auto model = std::make_unique<DecoderModel>(config, table, torch::TensorOptions().dtype(dtype).device(device));
  model->InitRandom(seed, config.initializer_range);
  return model;
}

std::string SavedConfigText(const DecoderModel& model) {
  nlohmann::json config = model.config().ToJson();
  const char* dtype_name = HuggingFaceDtypeName(model.dtype());
  // transformers 5 writes "dtype", 4.x "torch_dtype": refresh whichever the config has.
  if (config.contains("torch_dtype")) config["torch_dtype"] = dtype_name;
  if (config.contains("dtype") || !config.contains("torch_dtype")) config["dtype"] = dtype_name;
  return config.dump(2) + "\n";
}

void SavePretrained(const DecoderModel& model, const std::string& folder_name) {
  const fs::path folder(folder_name);
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) throw ModelError(folder_name + ": cannot create the folder: " + error.message());

  WriteTextAtomically(folder / "config.json", SavedConfigText(model));

  const fs::path weights = folder / "model.safetensors";
  const fs::path temp = weights.string() + ".tmp";
  WriteSafetensors(temp.string(), model.StateDict(), {{"format", "pt"}});
  fs::rename(temp, weights, error);
  if (error) throw ModelError(weights.string() + ": rename failed: " + error.message());
}

}  // namespace tigon::models
