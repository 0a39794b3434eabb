#include "runtime/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace tigon::engine {
namespace {

// A "Name: N kB" line of /proc/meminfo in bytes; -1 when absent.
int64_t MeminfoBytes(const char* name) {
  std::FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (meminfo == nullptr) return -1;
  int64_t bytes = -1;
  char line[256];
  const size_t length = std::strlen(name);
  while (std::fgets(line, sizeof line, meminfo) != nullptr) {
    long long kib = 0;
    if (std::strncmp(line, name, length) == 0 && line[length] == ':' &&
        std::sscanf(line + length + 1, " %lld kB", &kib) == 1) {
      bytes = static_cast<int64_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(meminfo);
  return bytes;
}

// A number in a cgroup v2 file of this process's cgroup; false for "max" (no limit) or no such file.
bool CgroupBytes(const char* file, int64_t* bytes) {
  const std::string path = std::string("/sys/fs/cgroup/") + file;
  std::FILE* in = std::fopen(path.c_str(), "r");
  if (in == nullptr) return false;
  long long number = 0;
  const bool ok = std::fscanf(in, "%lld", &number) == 1;
  std::fclose(in);
  *bytes = number;
  return ok;
}

}  // namespace

int64_t MachineMemoryBytes() {
  int64_t total = std::max<int64_t>(0, MeminfoBytes("MemTotal"));
  int64_t limit = 0;
  if (CgroupBytes("memory.max", &limit) && limit > 0 && (total == 0 || limit < total)) total = limit;
  return total;
}

int64_t HostAvailableBytes() {
  int64_t available = MeminfoBytes("MemAvailable");
  int64_t limit = 0, current = 0;
  if (CgroupBytes("memory.max", &limit) && CgroupBytes("memory.current", &current)) {
    const int64_t room = std::max<int64_t>(0, limit - current);
    available = available < 0 ? room : std::min(available, room);
  }
  return available;
}

}  // namespace tigon::engine
