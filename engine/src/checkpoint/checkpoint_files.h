// The files of a checkpoint folder (config.json, model.safetensors or shards, optimizer.safetensors,
// trainer_state.json), written and read relative to directory descriptors (atomic_dir.h): no path is
// resolved again after the caller opened the folder, and no link inside it is followed.
#pragma once

#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace tigon::engine {

struct CheckpointContents {
  std::string config_json;                             // config.json
  std::map<std::string, torch::Tensor> model;          // model.safetensors
  std::map<std::string, torch::Tensor> optimizer;      // optimizer.safetensors
  std::map<std::string, std::string> optimizer_metadata;
  std::string trainer_state;                           // trainer_state.json
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
