// The files of a checkpoint folder (config.json, model.safetensors or shards, optimizer.safetensors,
// tigon_state.json, and the tokenizer and generation config of the model folder the session came from),
// written and read relative to directory descriptors (atomic_dir.h): no path is resolved again after the
// caller opened the folder, and no link inside it is followed.
#pragma once

#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "tigon/engine.h"

namespace tigon::engine {

// Tigon's own state (step, seed, precision, optimizer settings, layout). Checkpoints written by 0.1.0
// named it trainer_state.json, the name Hugging Face Trainer uses for a different schema; loads still
// read that name when the new one is absent.
inline constexpr const char* kTigonStateFile = "tigon_state.json";
inline constexpr const char* kLegacyTigonStateFile = "trainer_state.json";

// A tokenizer.json is at most tens of MB (Gemma 3's: 33 MB); larger files are not copied.
inline constexpr int64_t kMaxCompanionFileBytes = 128 << 20;

// The companion files (kModelFolderCompanionFiles, engine.h) present in `model_folder` (regular files, links followed: a Hugging Face cache's
// snapshot links to its blobs), by name with their contents. Throws models::ModelError for a file that
// cannot be read or is over kMaxCompanionFileBytes.
std::map<std::string, std::string> ReadCompanionFiles(const std::string& model_folder);

struct CheckpointContents {
  std::string config_json;                             // config.json
  std::map<std::string, torch::Tensor> model;          // model.safetensors
  std::map<std::string, torch::Tensor> optimizer;      // optimizer.safetensors
  std::map<std::string, std::string> optimizer_metadata;
  std::string tigon_state;                             // tigon_state.json
  std::map<std::string, std::string> companion_files;  // kModelFolderCompanionFiles, by name
};

// Writes `contents` into a temporary folder inside `parent_fd` and publishes it as `name`
// (PublishDirectory). Throws std::system_error for I/O failures (errno kept).
void WriteCheckpoint(int parent_fd, const std::string& name, const CheckpointContents& contents);

// Readers of one file inside the folder `dir_fd`; `label` names the checkpoint in messages. Malformed
// content throws models::ModelError, I/O failures std::system_error.
nlohmann::json ReadJsonAt(int dir_fd, const std::string& file, const std::string& label);
std::map<std::string, torch::Tensor> ReadSafetensorsAt(int dir_fd, const std::string& file, const std::string& label);
// model.safetensors, or the shards model.safetensors.index.json lists (plain names inside the folder).
std::map<std::string, torch::Tensor> ReadModelTensorsAt(int dir_fd, const std::string& label);

}  // namespace tigon::engine
