// The HTTP endpoint that serves Metrics::Render() at /metrics (cpp-httplib, its own thread and port).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace tigon::server {

class MetricsEndpoint {
 public:
  explicit MetricsEndpoint(const Metrics* metrics);
  ~MetricsEndpoint();

  // Binds HOST:PORT (port 0 picks a free one, returned in `bound_port`) and starts serving.
  bool Start(const std::string& address, int* bound_port, std::string* error);
  void Stop();

 private:
  const Metrics* metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace tigon::server
