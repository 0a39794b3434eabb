// Checkpoint paths from requests, resolved inside --checkpoint-root.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tigon::server {

class CheckpointRoot {
 public:
  CheckpointRoot() = default;  // disabled

  // Creates `dir` when missing and keeps its canonical form.
  static bool Open(const std::string& dir, CheckpointRoot* out, std::string* error);

  bool enabled() const { return !root_.empty(); }

  // The engine writes a checkpoint into "<final>.tmp-<pid>-<n>" and renames it into place; a process
  // killed meanwhile leaves that folder behind. Removes those left by processes that no longer run
  // (a live process may be writing one) and returns their paths relative to the root.
  std::vector<std::string> RemoveStaleTemporaries() const;
  // Whether a path component has the engine's temporary form (never a checkpoint to load or save).
  static bool IsTemporaryName(const std::string& component, int64_t* pid = nullptr);
  const std::string& root() const { return root_; }

  // A relative path is taken inside the root; an absolute one must already lie inside it. Symbolic
  // links and ".." are resolved first, so a path that ends up outside the root, or at the root
  // itself, is refused: FAILED_PRECONDITION when checkpoints are disabled, INVALID_ARGUMENT for an
  // empty path, one with a NUL byte or one naming a temporary folder of an unfinished save,
  // PERMISSION_DENIED for an escape. On success `absolute` is
  // the resolved path and `relative` the same path relative to the root.
  grpc::Status Resolve(const std::string& request_path, std::string* absolute, std::string* relative) const;

 private:
  std::string root_;
};

}  // namespace tigon::server
