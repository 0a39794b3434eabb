#include "server/checkpoint_paths.h"

#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "server/client_text.h"

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

constexpr int kFolderFlags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;

std::string Join(const std::vector<std::string>& parts, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += (i > begin ? "/" : "") + parts[i];
  return out;
}

// Opens the folder `parts` below `base`. With openat2, links are followed but may not lead out of `base`
// (EXDEV); without it (kernels before 5.6, or a sandbox that refuses the call), each folder is opened
// relative to the one before and no link is followed (ELOOP).
int OpenBeneath(int base, const std::vector<std::string>& parts, size_t begin, size_t end) {
  static std::atomic<bool> no_openat2{false};
  if (!no_openat2.load()) {
    struct open_how how {};
    how.flags = kFolderFlags;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const std::string path = Join(parts, begin, end);
    const long fd = ::syscall(SYS_openat2, base, path.c_str(), &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return static_cast<int>(fd);
    no_openat2 = true;
  }
  int current = ::dup(base);
  for (size_t i = begin; i < end && current >= 0; ++i) {
    const int next = ::openat(current, parts[i].c_str(), kFolderFlags | O_NOFOLLOW);
    const int saved = errno;
    ::close(current);
    errno = saved;
    current = next;
  }
  return current;
}

bool SameFolder(int a, int b) {
  struct stat sa {}, sb {};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

FolderFd& FolderFd::operator=(FolderFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FolderFd::~FolderFd() {
  if (fd_ >= 0) ::close(fd_);
}

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
  const int fd = ::open(canonical.c_str(), kFolderFlags);
  if (fd < 0) {
    *error = "cannot open the checkpoint root '" + dir + "': " + std::strerror(errno);
    return false;
  }
  out->root_ = canonical.string();
  out->given_root_ = fs::absolute(dir).lexically_normal().string();
  while (out->given_root_.size() > 1 && out->given_root_.back() == '/') out->given_root_.pop_back();
  out->root_fd_ = std::make_shared<const FolderFd>(fd);
  return true;
}

grpc::Status CheckpointRoot::Locate(const std::string& request_path, const Caller& caller,
                                    CheckpointLocation* out) const {
  using grpc::StatusCode;
  if (!enabled()) {
    return grpc::Status(StatusCode::FAILED_PRECONDITION,
                        "checkpoints are disabled: start tigon-server with --checkpoint-root DIR");
  }
  if (request_path.empty()) return grpc::Status(StatusCode::INVALID_ARGUMENT, "the checkpoint path is empty");
  if (request_path.size() > kMaxPathBytes) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT, "the checkpoint path is " + std::to_string(request_path.size()) +
                                                          " bytes, more than the " + std::to_string(kMaxPathBytes) +
                                                          " allowed");
  }
  if (request_path.find('\0') != std::string::npos) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT, "the checkpoint path contains a NUL byte");
  }
  const std::string shown = "'" + ClientText(request_path) + "'";
  const grpc::Status outside(StatusCode::PERMISSION_DENIED,
                             "the checkpoint path " + shown + " resolves outside the server's checkpoint root");
  std::vector<std::string> base;
  if (!caller.admin) base.push_back(caller.name);
  std::vector<std::string> parts;
  const fs::path requested(request_path);
  if (requested.is_absolute()) {
    const fs::path normal = requested.lexically_normal();
    fs::path inside = normal.lexically_relative(root_);
    if (inside.empty() || *inside.begin() == "..") inside = normal.lexically_relative(given_root_);
    if (inside.empty() || *inside.begin() == "..") return outside;
    for (const auto& part : inside) {
      if (!part.empty() && part != ".") parts.push_back(part.string());
    }
  } else {
    parts = base;
    for (const auto& part : requested) {
      if (part.empty() || part == ".") continue;
      if (part == "..") {
        if (parts.empty()) return outside;
        parts.pop_back();
      } else {
        parts.push_back(part.string());
      }
    }
  }
  if (parts.size() < base.size() || !std::equal(base.begin(), base.end(), parts.begin())) {
    return grpc::Status(StatusCode::PERMISSION_DENIED,
                        "the checkpoint path " + shown + " lies in another principal's namespace: the checkpoints of '" +
                            caller.name + "' live under '" + caller.name +
                            "/' of the checkpoint root (an admin token reaches every namespace)");
  }
  if (parts.size() == base.size()) {
    return grpc::Status(StatusCode::INVALID_ARGUMENT,
                        std::string("the checkpoint path must name a folder inside ") +
                            (base.empty() ? "the checkpoint root, not the root itself" : "your namespace, not the "
                                                                                          "namespace itself"));
  }
  for (const auto& part : parts) {
    if (part.size() > 255) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT,
                          "the checkpoint path " + shown + " has a component longer than 255 bytes");
    }
    if (IsTemporaryName(part)) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT,
                          "the checkpoint path " + shown +
                              " names a temporary folder of an unfinished save (NAME.tmp-PID-N), not a checkpoint");
    }
  }
  if (parts.front() == kSessionJournalFolder) {
    return grpc::Status(StatusCode::PERMISSION_DENIED, std::string("the checkpoint root's '") +
                                                           kSessionJournalFolder +
                                                           "' folder holds the server's session records, not checkpoints");
  }
  out->relative = Join(parts, base.size(), parts.size());
  out->namespace_depth = base.size();
  out->components = std::move(parts);
  return grpc::Status::OK;
}

grpc::Status CheckpointRoot::OpenFolders(const CheckpointLocation& location, size_t count, bool create,
                                         FolderFd* out) const {
  const auto& parts = location.components;
  const size_t depth = location.namespace_depth;
  FolderFd current(::dup(root_fd_->get()));
  FolderFd space(::dup(root_fd_->get()));  // the caller's namespace, once reached
  int error = current.get() < 0 || space.get() < 0 ? errno : 0;
  for (size_t i = 0; i < count && error == 0; ++i) {
    const char* name = parts[i].c_str();
    // The namespace folder itself is never a link; below it, links may lead further down.
    int fd = i < depth ? ::openat(current.get(), name, kFolderFlags | O_NOFOLLOW)
                       : OpenBeneath(space.get(), parts, depth, i + 1);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(current.get(), name, 0755) != 0 && errno != EEXIST) {
        error = errno;
        break;
      }
      fd = ::openat(current.get(), name, kFolderFlags | O_NOFOLLOW);
    }
    if (fd < 0) {
      error = errno;
      // O_DIRECTORY | O_NOFOLLOW on a link answers ENOTDIR: say what it is.
      struct stat st {};
      if (error == ENOTDIR && ::fstatat(current.get(), name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        error = ELOOP;
      }
      break;
    }
    current = FolderFd(fd);
    if (i + 1 == depth) space = FolderFd(::dup(fd));
  }
  if (error == 0) {
    *out = std::move(current);
    return grpc::Status::OK;
  }
  using grpc::StatusCode;
  const std::string shown = "'" + ClientText(location.relative) + "'";
  switch (error) {
    case ENOENT:
      return grpc::Status(StatusCode::NOT_FOUND, "no checkpoint " + shown + " under the server's checkpoint root");
    case ENOTDIR:
      return grpc::Status(create ? StatusCode::INVALID_ARGUMENT : StatusCode::NOT_FOUND,
                          "a part of the checkpoint path " + shown + " is not a folder");
    case EXDEV:
    case ELOOP:
      return grpc::Status(StatusCode::PERMISSION_DENIED,
                          "the checkpoint path " + shown + " leads through a symbolic link outside " +
                              (depth == 0 ? "the server's checkpoint root" : "your checkpoint namespace"));
    case ENOSPC:
    case EDQUOT:
      return grpc::Status(StatusCode::RESOURCE_EXHAUSTED,
                          "cannot create the folders of checkpoint " + shown + ": " + std::strerror(error));
    default:
      return grpc::Status(StatusCode::INTERNAL, "cannot open the folders of checkpoint " + shown + ": " +
                                                    std::strerror(error));
  }
}

grpc::Status CheckpointRoot::OpenForSave(const std::string& request_path, const Caller& caller,
                                         CheckpointSaveTarget* out) const {
  grpc::Status status = Locate(request_path, caller, &out->location);
  if (!status.ok()) return status;
  status = OpenFolders(out->location, out->location.components.size() - 1, /*create=*/true, &out->parent);
  if (!status.ok()) return status;
  out->name = out->location.components.back();
  out->relative = out->location.relative;
  return grpc::Status::OK;
}

grpc::Status CheckpointRoot::CheckStillInPlace(const CheckpointSaveTarget& target) const {
  FolderFd again;
  const grpc::Status status =
      OpenFolders(target.location, target.location.components.size() - 1, /*create=*/false, &again);
  if (status.ok() && SameFolder(again.get(), target.parent.get())) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::ABORTED,
                      "a folder on the path of checkpoint '" + ClientText(target.relative) +
                          "' was moved or replaced during the save; the checkpoint is in the folder as it was when "
                          "the save began, not at that path: save again");
}

grpc::Status CheckpointRoot::OpenForLoad(const std::string& request_path, const Caller& caller,
                                         CheckpointLoadTarget* out) const {
  grpc::Status status = Locate(request_path, caller, &out->location);
  if (!status.ok()) return status;
  status = OpenFolders(out->location, out->location.components.size(), /*create=*/false, &out->folder);
  if (!status.ok()) return status;
  out->relative = out->location.relative;
  return grpc::Status::OK;
}

grpc::Status CheckpointRoot::LocateFolder(const std::string& request_path, const Caller& caller, std::string* folder,
                                          std::string* namespace_folder) const {
  CheckpointLocation location;
  grpc::Status status = Locate(request_path, caller, &location);
  if (!status.ok()) return status;
  *namespace_folder = root_;
  for (size_t i = 0; i < location.namespace_depth; ++i) *namespace_folder += "/" + location.components[i];
  *folder = root_ + "/" + Join(location.components, 0, location.components.size());
  return grpc::Status::OK;
}

std::string RootRelative(const CheckpointLocation& location) {
  return Join(location.components, 0, location.components.size());
}

}  // namespace tigon::server
