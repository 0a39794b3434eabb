// The folders CreateSession's model_path may name: Hugging Face folders inside a --model-root (the
// server's model repository), and the caller's own checkpoints under --checkpoint-root. Nothing else on
// the server's disk is reachable, and a refusal says nothing about what exists outside.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tigon/v1/trainer.pb.h"

namespace tigon::server {

// A resolved model folder: its canonical path (no symbolic link left in it) and its config.json.
struct ModelFolder {
  std::string path;
  std::string config_json;
};

class ModelRoots {
 public:
  // A Hugging Face config is a few KB; a bigger config.json (or index) is refused before it is read.
  static constexpr int64_t kMaxConfigBytes = 4 << 20;
  static constexpr int64_t kMaxIndexBytes = 64 << 20;

  ModelRoots() = default;  // no model root

  // Each folder must exist; their canonical forms are kept, in the order given.
  static bool Open(const std::vector<std::string>& dirs, ModelRoots* out, std::string* error);

  const std::vector<std::string>& roots() const { return roots_; }

  // Where a checkpoint folder of the caller would be, for a model_path that names one: OK with the
  // folder and the root it must stay inside (symbolic links included), or a status for a path that is
  // not one of the caller's checkpoints.
  using CheckpointLookup =
      std::function<grpc::Status(const std::string& request_path, std::string* folder, std::string* root)>;

  // A relative path is looked up in each model root in turn, then among the caller's checkpoints; an
  // absolute one must lie inside a model root or be one of the caller's checkpoints. The folder, its
  // config.json and every weight file it names (model.safetensors, or the index and its shards) must
  // resolve inside the same root, symbolic links included. Every folder that is not offered (missing,
  // outside, no config.json, a link out of the root) gets the same NOT_FOUND message, which names no
  // path; FAILED_PRECONDITION when neither a model root nor checkpoints are configured.
  grpc::Status Resolve(const std::string& request_path, const CheckpointLookup& checkpoints,
                       ModelFolder* folder) const;

 private:
  std::vector<std::string> roots_;
};

// model.safetensors.index.json -> the shard files of its weight_map. false unless the text is bounded JSON
// (common/bounded_json.h) with a weight_map object whose values are relative file names.
bool ParseShardIndex(const std::string& text, std::set<std::string>* shards);

class CheckpointRoot;
struct Caller;
// The checkpoints a model_path may name: those that LoadCheckpoint would reach for `caller`.
ModelRoots::CheckpointLookup CheckpointsLookup(const CheckpointRoot& checkpoints, const Caller& caller);

// CreateSession's model folder: for a model_path request, roots.Resolve with the caller's checkpoints;
// OK with `folder` left empty for a config_json request.
grpc::Status ResolveModelFolder(const ModelRoots& roots, const CheckpointRoot& checkpoints, const Caller& caller,
                                const v1::CreateSessionRequest& request, ModelFolder* folder);

// An engine error about a resolved model folder, with the folder's server path left out of its
// message (files are named relative to the folder; the client named it by model_path and need not
// learn where the roots are).
grpc::Status HideModelFolder(const grpc::Status& status, const ModelFolder& folder);

}  // namespace tigon::server
