#include "server/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <prometheus/metric_family.h>
#include <sstream>
#include <string>
#include <vector>

namespace tigon::server {
namespace {

prometheus::MetricFamily One(const char* name, const char* help, prometheus::MetricType type, double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {metric}};
}

// Seconds since the epoch at which the machine booted (the btime line of /proc/stat).
double BootTime() {
  std::ifstream stat("/proc/stat");
  std::string key;
  double value = 0;
  while (stat >> key) {
    if (key == "btime" && stat >> value) return value;
    stat.ignore(1 << 20, '\n');
  }
  return 0;
}

int CountOpenFds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;  // the directory stream's own descriptor
}

class ProcessCollector final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::ifstream file("/proc/self/stat");
    std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    // The command name (field 2) is in parentheses and may hold spaces: fields are counted after it.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return {};
    std::istringstream fields(text.substr(close + 2));
    std::vector<std::string> f((std::istream_iterator<std::string>(fields)), std::istream_iterator<std::string>());
    if (f.size() < 22) return {};
    // f[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24 (pages).
    const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
    const double cpu = (std::stod(f[11]) + std::stod(f[12])) / ticks;
    const double start = BootTime() + std::stod(f[19]) / ticks;
    std::vector<prometheus::MetricFamily> out = {
        One("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
            prometheus::MetricType::Counter, cpu),
        One("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
            prometheus::MetricType::Gauge, start),
        One("process_virtual_memory_bytes", "Virtual memory size in bytes.", prometheus::MetricType::Gauge,
            std::stod(f[20])),
        One("process_resident_memory_bytes", "Resident memory size in bytes.", prometheus::MetricType::Gauge,
            std::stod(f[21]) * page),
    };
    const int fds = CountOpenFds();
    if (fds >= 0) {
      out.push_back(One("process_open_fds", "Number of open file descriptors.", prometheus::MetricType::Gauge, fds));
    }
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      out.push_back(One("process_max_fds", "Maximum number of open file descriptors.", prometheus::MetricType::Gauge,
                        static_cast<double>(limit.rlim_cur)));
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<prometheus::Collectable> MakeProcessCollector() { return std::make_shared<ProcessCollector>(); }

}  // namespace tigon::server
