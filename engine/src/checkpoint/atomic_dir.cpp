#include "checkpoint/atomic_dir.h"

#include <fcntl.h>
#include <ftw.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace fs = std::filesystem;

namespace tigon::engine {
namespace {

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

void FsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) ThrowErrno("cannot open " + path + " to flush it");
  if (::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    ThrowErrno("cannot flush " + path);
  }
  ::close(fd);
}

std::string ParentOf(const std::string& path) {
  fs::path p = fs::absolute(fs::path(path)).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p.parent_path().string();
}

}  // namespace

std::string MakeTempSiblingDir(const std::string& final_dir) {
  static std::atomic<int> counter{0};
  std::string base = fs::absolute(fs::path(final_dir)).lexically_normal().string();
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::error_code ec;
  fs::create_directories(ParentOf(base), ec);
  if (ec) throw std::runtime_error("cannot create " + ParentOf(base) + ": " + ec.message());
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = base + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (::mkdir(candidate.c_str(), 0755) == 0) return candidate;
    if (errno != EEXIST) ThrowErrno("cannot create " + candidate);
  }
  throw std::runtime_error("cannot find a free temporary name next to " + base);
}

void PublishDirectory(const std::string& temp_dir, const std::string& final_dir) {
  std::string target = fs::absolute(fs::path(final_dir)).lexically_normal().string();
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  try {
    for (const auto& entry : fs::directory_iterator(temp_dir)) {
      if (entry.is_regular_file()) FsyncPath(entry.path().string(), false);
    }
    FsyncPath(temp_dir, true);
    struct stat st {};
    if (::stat(target.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw std::runtime_error(target + " exists and is not a directory");
      // Swap atomically: afterwards temp_dir holds the previous checkpoint.
      if (::syscall(SYS_renameat2, AT_FDCWD, temp_dir.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
        ThrowErrno("cannot swap " + temp_dir + " into " + target);
      FsyncPath(ParentOf(target), true);
      RemoveTree(temp_dir);
    } else {
      if (::rename(temp_dir.c_str(), target.c_str()) != 0) ThrowErrno("cannot rename " + temp_dir + " to " + target);
      FsyncPath(ParentOf(target), true);
    }
  } catch (...) {
    RemoveTree(temp_dir);
    throw;
  }
}

namespace {
int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
}  // namespace

// POSIX nftw rather than std::filesystem::remove_all: LibTorch 2.11's libtorch.so exports its own copy of
// remove_all, which crashes (a call through a null pointer) when it wins symbol resolution.
void RemoveTree(const std::string& path) {
  ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace tigon::engine
