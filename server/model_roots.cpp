#include "server/model_roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "common/bounded_json.h"
#include "server/checkpoint_paths.h"
#include "tigon/engine.h"

namespace tigon::server {
namespace {

const char* const kNotOffered =
    "model_path names no model this server offers: give a folder with a config.json inside one of the "
    "server's model roots (--model-root), or one of your checkpoints";

// The canonical path (every symbolic link and ".." resolved), or empty when it does not exist.
std::string RealPath(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return "";
  std::string out(resolved);
  std::free(resolved);
  return out;
}

// Whether canonical `path` is `root` or lies below it (component-wise: "/models2" is not inside "/models").
bool Inside(const std::string& path, const std::string& root) {
  if (path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || root == "/" || path[root.size()] == '/';
}

enum class FileCheck { kOk, kMissing, kOutside, kNotRegular, kTooLarge };

// Opens a file of a model folder and checks what was opened, not what the name pointed at a moment
// before: the descriptor's own path must lie inside `root`, it must be a regular file (O_NONBLOCK: a FIFO
// does not block the open) of at most `max_bytes` when given. With `content`, reads it whole.
FileCheck CheckFile(const std::string& path, const std::string& root, int64_t max_bytes, std::string* content) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return FileCheck::kMissing;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  char target[PATH_MAX + 1];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, PATH_MAX);
  if (n <= 0 || !Inside(std::string(target, static_cast<size_t>(n)), root)) return FileCheck::kOutside;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return FileCheck::kNotRegular;
  if (max_bytes > 0 && st.st_size > max_bytes) return FileCheck::kTooLarge;
  if (content != nullptr) {
    content->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < content->size()) {
      const ssize_t got = ::pread(fd, content->data() + done, content->size() - done, static_cast<off_t>(done));
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    content->resize(done);
  }
  return FileCheck::kOk;
}

grpc::Status Refused(grpc::StatusCode code, const std::string& message) { return grpc::Status(code, message); }

const char* const kOutsideWeights =
    "the model's weight files must lie inside its model root; one is a symbolic link out of it and is not read";

// The weight files the engine will read: model.safetensors, or model.safetensors.index.json and every
// shard it lists. Each must be a regular file inside `root`.
grpc::Status CheckWeights(const std::string& dir, const std::string& root) {
  switch (CheckFile(dir + "/model.safetensors", root, 0, nullptr)) {
    case FileCheck::kOk:
      return grpc::Status::OK;
    case FileCheck::kOutside:
      return Refused(grpc::StatusCode::PERMISSION_DENIED, kOutsideWeights);
    case FileCheck::kMissing:
      break;
    default:
      return Refused(grpc::StatusCode::FAILED_PRECONDITION, "the model's model.safetensors is not a regular file");
  }
  std::string index_text;
  switch (CheckFile(dir + "/model.safetensors.index.json", root, ModelRoots::kMaxIndexBytes, &index_text)) {
    case FileCheck::kOk:
      break;
    case FileCheck::kMissing:
      return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                     "the model folder has neither model.safetensors nor model.safetensors.index.json");
    case FileCheck::kOutside:
      return Refused(grpc::StatusCode::PERMISSION_DENIED, kOutsideWeights);
    case FileCheck::kTooLarge:
      return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                     "the model's model.safetensors.index.json is larger than " +
                         std::to_string(ModelRoots::kMaxIndexBytes >> 20) + " MiB");
    case FileCheck::kNotRegular:
      return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                     "the model's model.safetensors.index.json is not a regular file");
  }
  std::set<std::string> shards;
  if (!ParseShardIndex(index_text, &shards)) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "the model's model.safetensors.index.json is not valid: it needs a \"weight_map\" object of "
                   "relative shard file names");
  }
  for (const std::string& shard : shards) {
    switch (CheckFile(dir + "/" + shard, root, 0, nullptr)) {
      case FileCheck::kOk:
        break;
      case FileCheck::kOutside:
        return Refused(grpc::StatusCode::PERMISSION_DENIED, kOutsideWeights);
      default:
        return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                       "a shard listed in the model's model.safetensors.index.json is missing or not a regular file");
    }
  }
  return grpc::Status::OK;
}

// The tokenizer and generation files the engine copies into the session's checkpoints
// (kModelFolderCompanionFiles): those present must lie inside `root` too, or a link could copy any file the
// server can read into a checkpoint.
grpc::Status CheckCompanionFiles(const std::string& dir, const std::string& root) {
  for (const char* file : kModelFolderCompanionFiles) {
    if (CheckFile(dir + "/" + file, root, 0, nullptr) == FileCheck::kOutside) {
      return Refused(grpc::StatusCode::PERMISSION_DENIED,
                     std::string("the model's ") + file +
                         " must lie inside its model root; it is a symbolic link out of it and is not read");
    }
  }
  return grpc::Status::OK;
}

}  // namespace

bool ParseShardIndex(const std::string& text, std::set<std::string>* shards) {
  shards->clear();
  const nlohmann::json index = ParseBoundedJsonOrDiscard(text);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return false;
  }
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) return false;
    const std::string file = shard.get<std::string>();
    if (file.empty() || file[0] == '/' || file.find('\0') != std::string::npos) return false;
    shards->insert(file);
  }
  return true;
}

bool ModelRoots::Open(const std::vector<std::string>& dirs, ModelRoots* out, std::string* error) {
  ModelRoots roots;
  for (const std::string& dir : dirs) {
    const std::string canonical = RealPath(dir);
    struct stat st {};
    if (canonical.empty() || ::stat(canonical.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      *error = "the model root '" + dir + "' is not an existing folder";
      return false;
    }
    roots.roots_.push_back(canonical);
  }
  *out = std::move(roots);
  return true;
}

grpc::Status ModelRoots::Resolve(const std::string& request_path, const CheckpointLookup& checkpoints,
                                 ModelFolder* folder) const {
  if (request_path.empty()) return Refused(grpc::StatusCode::INVALID_ARGUMENT, "model_path is empty");
  if (request_path.find('\0') != std::string::npos) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "model_path contains a NUL byte");
  }
  if (request_path.size() > PATH_MAX) {
    return Refused(grpc::StatusCode::INVALID_ARGUMENT, "model_path is longer than a path can be");
  }
  // (folder as named, root it must stay inside), in the order they are tried.
  std::vector<std::pair<std::string, std::string>> candidates;
  for (const std::string& root : roots_) {
    candidates.emplace_back(request_path[0] == '/' ? request_path : root + "/" + request_path, root);
  }
  std::string checkpoint, checkpoint_root;
  const grpc::Status in_checkpoints = checkpoints ? checkpoints(request_path, &checkpoint, &checkpoint_root)
                                                  : Refused(grpc::StatusCode::FAILED_PRECONDITION, "");
  if (in_checkpoints.ok()) {
    candidates.emplace_back(checkpoint, RealPath(checkpoint_root));
  } else if (roots_.empty() && in_checkpoints.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                   "model_path is off on this server: it has no model root (--model-root DIR) and no "
                   "checkpoints (--checkpoint-root DIR); send config_json instead");
  }
  for (const auto& [named, root] : candidates) {
    const std::string dir = RealPath(named);
    struct stat st {};
    if (root.empty() || dir.empty() || !Inside(dir, root) || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      continue;
    }
    std::string config;
    switch (CheckFile(dir + "/config.json", root, kMaxConfigBytes, &config)) {
      case FileCheck::kOk:
        break;
      case FileCheck::kTooLarge:
        return Refused(grpc::StatusCode::FAILED_PRECONDITION,
                       "the model's config.json is larger than " + std::to_string(kMaxConfigBytes >> 20) +
                           " MiB (a Hugging Face config is a few KB); it is not read");
      default:
        continue;  // no usable config.json: not a model folder
    }
    grpc::Status weights = CheckWeights(dir, root);
    if (!weights.ok()) return weights;
    grpc::Status companions = CheckCompanionFiles(dir, root);
    if (!companions.ok()) return companions;
    folder->path = dir;
    folder->config_json = std::move(config);
    return grpc::Status::OK;
  }
  return Refused(grpc::StatusCode::NOT_FOUND, kNotOffered);
}

ModelRoots::CheckpointLookup CheckpointsLookup(const CheckpointRoot& checkpoints, const Caller& caller) {
  return [&checkpoints, caller](const std::string& request_path, std::string* folder, std::string* root) {
    return checkpoints.LocateFolder(request_path, caller, folder, root);
  };
}

grpc::Status ResolveModelFolder(const ModelRoots& roots, const CheckpointRoot& checkpoints, const Caller& caller,
                                const v1::CreateSessionRequest& request, ModelFolder* folder) {
  if (request.model_case() != v1::CreateSessionRequest::kModelPath) return grpc::Status::OK;
  return roots.Resolve(request.model_path(), CheckpointsLookup(checkpoints, caller), folder);
}

grpc::Status HideModelFolder(const grpc::Status& status, const ModelFolder& folder) {
  if (folder.path.empty() || status.ok()) return status;
  std::string out = status.error_message();
  for (const std::string& from : {folder.path + "/", folder.path}) {
    const std::string to = from.back() == '/' ? "" : "the model folder";
    for (size_t at = out.find(from); at != std::string::npos; at = out.find(from, at + to.size())) {
      out.replace(at, from.size(), to);
    }
  }
  return grpc::Status(status.error_code(), out);
}

}  // namespace tigon::server
