#include "server/checkpoint_paths.h"

#include <ftw.h>
#include <signal.h>
#include <stdio.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace tigon::server {
namespace fs = std::filesystem;

namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

// POSIX nftw rather than std::filesystem::remove_all: libtorch 2.11, loaded into this process with the
// engine, exports a remove_all that crashes when it wins symbol resolution (see engine/src/checkpoint/atomic_dir.cpp).
void RemoveTree(const std::string& path) { ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS); }

bool AllDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

bool CheckpointRoot::IsTemporaryName(const std::string& component, int64_t* pid) {
  const size_t at = component.rfind(".tmp-");
  if (at == std::string::npos || at == 0) return false;
  const std::string rest = component.substr(at + 5);  // "<pid>-<n>"
  const size_t dash = rest.find('-');
  if (dash == std::string::npos || !AllDigits(rest.substr(0, dash)) || !AllDigits(rest.substr(dash + 1))) return false;
  if (pid != nullptr) *pid = std::strtoll(rest.substr(0, dash).c_str(), nullptr, 10);
  return true;
}

std::vector<std::string> CheckpointRoot::RemoveStaleTemporaries() const {
  std::vector<std::string> removed;
  if (!enabled()) return removed;
  std::vector<fs::path> stale;
  std::error_code ec;
  fs::recursive_directory_iterator it(root_, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    int64_t pid = 0;
    if (!it->is_directory(ec) || it->is_symlink(ec) || !IsTemporaryName(it->path().filename().string(), &pid)) {
      continue;
    }
    it.disable_recursion_pending();
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM means it runs (as another user).
    const bool running = pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    if (!running) stale.push_back(it->path());
  }
  for (const auto& path : stale) {
    RemoveTree(path.string());
    removed.push_back(path.lexically_relative(root_).string());
  }
  return removed;
}

bool CheckpointRoot::Open(const std::string& dir, CheckpointRoot* out, std::string* error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    *error = "cannot create the checkpoint root '" + dir + "': " + (ec ? ec.message() : "not a directory");
    return false;
  }
  fs::path canonical = fs::canonical(dir, ec);
  if (ec) {
    *error = "cannot resolve the checkpoint root '" + dir + "': " + ec.message();
    return false;
  }
  out->root_ = canonical.string();
  return true;
}

grpc::Status CheckpointRoot::Resolve(const std::string& request_path, std::string* absolute,
                                     std::string* relative) const {
  if (!enabled()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "checkpoints are disabled: start tigon-server with --checkpoint-root DIR");
  }
  if (request_path.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the checkpoint path is empty");
  }
  if (request_path.find('\0') != std::string::npos) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the checkpoint path contains a NUL byte");
  }
  const fs::path root(root_);
  fs::path requested(request_path);
  fs::path candidate = requested.is_absolute() ? requested : root / requested;
  std::error_code ec;
  // Follows the symbolic links of the part that exists and normalises ".." in the rest.
  fs::path resolved = fs::weakly_canonical(candidate, ec);
  if (ec) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "cannot resolve the checkpoint path '" + request_path + "': " + ec.message());
  }
  resolved = resolved.lexically_normal();
  if (!resolved.empty() && resolved.filename().empty()) resolved = resolved.parent_path();  // "a/" -> "a"
  fs::path inside = resolved.lexically_relative(root);
  bool escapes = inside.empty() || *inside.begin() == "..";
  if (escapes) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the checkpoint path '" + request_path + "' resolves outside the server's checkpoint root");
  }
  if (inside == ".") {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the checkpoint path must name a folder inside the checkpoint root, not the "
                        "root itself");
  }
  for (const auto& component : inside) {
    if (IsTemporaryName(component.string())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the checkpoint path '" + request_path +
                              "' names a temporary folder of an unfinished save (NAME.tmp-PID-N), not a checkpoint");
    }
  }
  *absolute = resolved.string();
  *relative = inside.string();
  return grpc::Status::OK;
}

}  // namespace tigon::server
