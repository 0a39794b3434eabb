#include "checkpoint/atomic_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <system_error>
#include <vector>

namespace tigon::engine {
namespace {

[[noreturn]] void ThrowErrno(const std::string& what, int error = errno) {
  throw std::system_error(error, std::generic_category(), what);
}

// One path component: the descriptor-relative calls below must not walk through other folders.
void CheckComponent(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    ThrowErrno("'" + name + "' is not a plain file name", EINVAL);
  }
}

void Fsync(int fd, const std::string& what) {
  if (::fsync(fd) != 0) ThrowErrno("cannot flush " + what);
}

bool SameFile(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

void RemoveContents(int dir_fd) {
  const int copy = ::dup(dir_fd);
  if (copy < 0) return;
  DIR* dir = ::fdopendir(copy);
  if (dir == nullptr) {
    ::close(copy);
    return;
  }
  std::vector<std::string> names;
  while (struct dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  for (const auto& name : names) RemoveTreeAt(dir_fd, name);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

StatusCode StatusCodeForErrno(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return StatusCode::kResourceExhausted;
    case ENOENT:
      return StatusCode::kNotFound;
    case ELOOP:
    case EINVAL:
    case ENOTDIR:
    case ENAMETOOLONG:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

TempDir MakeTempDir(int parent_fd, const std::string& name) {
  CheckComponent(name);
  static std::atomic<int> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string candidate = name + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (::mkdirat(parent_fd, candidate.c_str(), 0755) != 0) {
      if (errno == EEXIST) continue;  // a leftover, or a name someone else took: try the next one
      ThrowErrno("cannot create the temporary folder " + candidate);
    }
    TempDir temp{UniqueFd(::openat(parent_fd, candidate.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)),
                 candidate};
    if (temp.fd.get() < 0) ThrowErrno("cannot open the temporary folder " + candidate);
    return temp;
  }
  ThrowErrno("cannot find a free temporary name next to " + name, EEXIST);
}

UniqueFd CreateFileAt(int dir_fd, const std::string& file) {
  CheckComponent(file);
  UniqueFd fd(::openat(dir_fd, file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (fd.get() < 0) ThrowErrno("cannot create " + file);
  return fd;
}

void WriteFileAt(int dir_fd, const std::string& file, const std::string& bytes) {
  UniqueFd fd = CreateFileAt(dir_fd, file);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ThrowErrno("cannot write " + file);
    done += static_cast<size_t>(n);
  }
  Fsync(fd.get(), file);
}

UniqueFd OpenFileAt(int dir_fd, const std::string& file) {
  CheckComponent(file);
  UniqueFd fd(::openat(dir_fd, file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) ThrowErrno("cannot open " + file);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ThrowErrno("cannot inspect " + file);
  if (!S_ISREG(st.st_mode)) ThrowErrno(file + " is not a regular file", EINVAL);
  return fd;
}

bool RegularFileAt(int dir_fd, const std::string& file) {
  struct stat st {};
  return ::fstatat(dir_fd, file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

void PublishDirectory(int parent_fd, TempDir& temp, const std::string& name) {
  CheckComponent(name);
  try {
    // The files were fsynced as they were written; the folder's own entries now.
    Fsync(temp.fd.get(), temp.name);
    struct stat written {};
    if (::fstat(temp.fd.get(), &written) != 0) ThrowErrno("cannot inspect " + temp.name);
    struct stat existing {};
    const bool replace = ::fstatat(parent_fd, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0;
    // A link under the name is replaced (exchanged, then unlinked), never written through.
    if (replace && !S_ISDIR(existing.st_mode) && !S_ISLNK(existing.st_mode)) {
      ThrowErrno(name + " exists and is not a folder", ENOTDIR);
    }
    // Swap atomically: afterwards temp.name holds the previous checkpoint. Both names are looked up in
    // parent_fd alone, and renameat2 never follows a link in the last component.
    const int flags = replace ? RENAME_EXCHANGE : RENAME_NOREPLACE;
    if (::syscall(SYS_renameat2, parent_fd, temp.name.c_str(), parent_fd, name.c_str(), flags) != 0) {
      ThrowErrno("cannot move " + temp.name + " into place as " + name);
    }
    Fsync(parent_fd, "the folder holding " + name);
    // Re-check: the folder now under `name` must be the one written (not something swapped in for the
    // temporary name meanwhile).
    struct stat published {};
    if (::fstatat(parent_fd, name.c_str(), &published, AT_SYMLINK_NOFOLLOW) != 0 || !SameFile(published, written)) {
      ThrowErrno(name + " was replaced while it was being saved", EAGAIN);
    }
    if (replace) RemoveTreeAt(parent_fd, temp.name);
  } catch (...) {
    RemoveTreeAt(parent_fd, temp.name);
    throw;
  }
}

// POSIX calls on descriptors rather than std::filesystem::remove_all: LibTorch 2.11's libtorch.so exports
// its own copy of remove_all, which crashes (a call through a null pointer) when it wins symbol resolution.
void RemoveTreeAt(int dir_fd, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) return;
  if (::unlinkat(dir_fd, name.c_str(), 0) == 0) return;  // a file or a link (never followed)
  if (errno != EISDIR && errno != EPERM) return;
  UniqueFd sub(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (sub.get() < 0) return;
  RemoveContents(sub.get());
  ::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR);
}

}  // namespace tigon::engine
