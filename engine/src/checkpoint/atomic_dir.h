// Crash-safe publication of a directory, relative to directory descriptors. The caller holds the folder
// that will contain the result open (`parent_fd`) for the whole save; a temporary folder is created in it
// and kept open, every file is created inside that one with O_EXCL | O_NOFOLLOW, and the temporary folder
// is then swapped in under its final name by renameat2 on the same descriptor. No path is looked up again
// later, so a symbolic link swapped into the tree meanwhile cannot send a file anywhere else.
//
// Failures throw std::system_error carrying errno, so that a full disk stays ENOSPC up to the status.
#pragma once

#include <string>

#include "tigon/engine.h"

namespace tigon::engine {

// An owned file descriptor, closed when it goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// A fresh empty folder "<name>.tmp-<pid>-<n>" inside `parent_fd`, open.
struct TempDir {
  UniqueFd fd;
  std::string name;
};
TempDir MakeTempDir(int parent_fd, const std::string& name);

// Creates `file` inside `dir_fd`, writes `bytes` and fsyncs it; never opens an existing entry or a link.
void WriteFileAt(int dir_fd, const std::string& file, const std::string& bytes);
// Creates `file` inside `dir_fd` for writing (O_EXCL | O_NOFOLLOW).
UniqueFd CreateFileAt(int dir_fd, const std::string& file);
// Opens the regular file `file` (one path component) inside `dir_fd` for reading, without following a
// link. Throws std::system_error (ENOENT when missing, ELOOP for a link, EINVAL for a non-plain name).
UniqueFd OpenFileAt(int dir_fd, const std::string& file);
// Whether `dir_fd` holds an entry `file` that is a regular file (links are not followed).
bool RegularFileAt(int dir_fd, const std::string& file);

// fsyncs the files of `temp` and the folder itself, then makes it `name` inside `parent_fd`: an atomic
// exchange with the previous folder of that name (which is then removed), or a rename when there is none.
// Afterwards checks that `name` is the folder written. On failure `temp` is removed.
void PublishDirectory(int parent_fd, TempDir& temp, const std::string& name);

// Removes the entry `name` of `dir_fd` and everything below it, without following links (best effort).
void RemoveTreeAt(int dir_fd, const std::string& name);

// The status code for a failed file operation: RESOURCE_EXHAUSTED for a full disk or quota (ENOSPC,
// EDQUOT, EFBIG), NOT_FOUND for a missing entry, INTERNAL otherwise. The one errno mapping of the engine.
StatusCode StatusCodeForErrno(int error);

}  // namespace tigon::engine
