// Checkpoint paths from requests, resolved inside --checkpoint-root, one namespace per principal.
//
// Namespaces: a user (the name an auth token stands for, auth.h) owns the folder "<root>/<name>": its
// relative paths start there, and an absolute path must lie inside it. Admins, and every caller when
// authentication is off (then all callers are one anonymous admin), address the whole root: "alice/run1"
// is Alice's run1. A user's path that leads into another's folder, by "..", by an absolute path or by a
// symbolic link, is PERMISSION_DENIED (for CreateSession's model_path: NOT_FOUND, model_roots.h).
//
// Resolution happens relative to a descriptor of the root held by the server: each folder is opened
// relative to the one before (openat2 with RESOLVE_BENEATH, so a link may only lead further down the
// caller's namespace; without openat2, links are not followed at all), and the descriptors reached are
// handed to the engine, which writes and reads through them. A link swapped in after the check therefore
// changes nothing about where files go.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/auth.h"

namespace tigon::server {

// An open folder, closed when it goes.
class FolderFd {
 public:
  FolderFd() = default;
  explicit FolderFd(int fd) : fd_(fd) {}
  FolderFd(FolderFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  FolderFd& operator=(FolderFd&& other) noexcept;
  FolderFd(const FolderFd&) = delete;
  FolderFd& operator=(const FolderFd&) = delete;
  ~FolderFd();
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// The folder of the root where --resume-sessions keeps its records (session_journal.h): a name no
// principal can have, and which no checkpoint path may enter.
inline constexpr const char* kSessionJournalFolder = "+sessions";

// Where a request's path leads, before anything is opened.
struct CheckpointLocation {
  std::vector<std::string> components;  // from the root: the caller's namespace first (for a user)
  size_t namespace_depth = 0;           // how many of them name the namespace (1 for a user, 0 for an admin)
  std::string relative;                 // the path as the caller addresses it (from its namespace)
};

// The location's folder relative to the root ("alice/run/step-4"): what an admin names it by.
std::string RootRelative(const CheckpointLocation& location);

// A checkpoint to save: the folder that holds it, open (created when missing), and its name in it.
struct CheckpointSaveTarget {
  FolderFd parent;
  std::string name;
  std::string relative;
  CheckpointLocation location;
};

// A checkpoint to load: its folder, open.
struct CheckpointLoadTarget {
  FolderFd folder;
  std::string relative;
  CheckpointLocation location;
};

class CheckpointRoot {
 public:
  // The longest checkpoint path a request may give.
  static constexpr size_t kMaxPathBytes = 4096;

  CheckpointRoot() = default;  // disabled

  // Creates `dir` when missing and keeps its canonical form and a descriptor of it.
  static bool Open(const std::string& dir, CheckpointRoot* out, std::string* error);

  bool enabled() const { return !root_.empty(); }

  // The engine writes a checkpoint into "<final>.tmp-<pid>-<n>" and renames it into place; a process
  // killed meanwhile leaves that folder behind. Removes those left by processes that no longer run
  // (a live process may be writing one) and returns their paths relative to the root.
  std::vector<std::string> RemoveStaleTemporaries() const;
  // Whether a path component has the engine's temporary form (never a checkpoint to load or save).
  static bool IsTemporaryName(const std::string& component, int64_t* pid = nullptr);
  const std::string& root() const { return root_; }

  // The lexical part: a relative path is taken inside the caller's namespace, an absolute one must lie
  // inside it; "." and ".." are applied. FAILED_PRECONDITION when checkpoints are disabled;
  // INVALID_ARGUMENT for an empty path, one with a NUL byte, one longer than kMaxPathBytes or with a
  // component longer than 255 bytes, the namespace folder itself, or one naming a temporary folder of an
  // unfinished save; PERMISSION_DENIED for a path outside the root or in another principal's namespace.
  grpc::Status Locate(const std::string& request_path, const Caller& caller, CheckpointLocation* out) const;

  // Locate, then opens the folders down to the checkpoint's parent, creating those missing.
  // PERMISSION_DENIED also for a symbolic link that leads out of the caller's namespace.
  grpc::Status OpenForSave(const std::string& request_path, const Caller& caller, CheckpointSaveTarget* out) const;
  // After the save: whether the path still leads to the folder the checkpoint was written into (ABORTED
  // when a folder on the way was moved or replaced meanwhile).
  grpc::Status CheckStillInPlace(const CheckpointSaveTarget& target) const;
  // Locate, then opens the checkpoint's folder (NOT_FOUND when there is none).
  grpc::Status OpenForLoad(const std::string& request_path, const Caller& caller, CheckpointLoadTarget* out) const;

  // CreateSession's model_path among the caller's checkpoints (model_roots.h): Locate, then the folder's
  // path and the folder it must stay inside, links included (the caller's namespace).
  grpc::Status LocateFolder(const std::string& request_path, const Caller& caller, std::string* folder,
                            std::string* namespace_folder) const;

 private:
  // Opens components[0, count) from the root; creates missing folders when `create`.
  grpc::Status OpenFolders(const CheckpointLocation& location, size_t count, bool create, FolderFd* out) const;

  std::string root_;
  std::string given_root_;  // as --checkpoint-root named it (absolute), for absolute request paths
  std::shared_ptr<const FolderFd> root_fd_;
};

}  // namespace tigon::server
