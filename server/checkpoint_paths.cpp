#include "server/checkpoint_paths.h"

#include <filesystem>
#include <system_error>

namespace tigon::server {
namespace fs = std::filesystem;

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
  *absolute = resolved.string();
  *relative = inside.string();
  return grpc::Status::OK;
}

}  // namespace tigon::server
