// The HTTP endpoint that serves the metrics at /metrics: prometheus-cpp's exposer (civetweb) on its own
// port, with enough worker threads and short read timeouts that slow or half-open clients cannot keep
// a scrape waiting, and optionally a bearer token that every /metrics request must carry. The same port
// answers the probes /healthz (200 while the process serves) and /readyz (200 while the gRPC service
// takes calls, 503 before it starts and while it drains), without a token.
#pragma once

#include <memory>
#include <string>

#include "server/auth.h"
#include "server/metrics.h"

namespace prometheus {
class Exposer;
}

namespace tigon::server {

class MetricsEndpoint {
 public:
  // Requests are served by this many civetweb worker threads; each connection holds one while it is
  // read, for at most kRequestTimeoutMs, so fewer than kWorkerThreads stalled clients never delay a scrape.
  static constexpr int kWorkerThreads = 128;
  static constexpr int kRequestTimeoutMs = 2000;

  explicit MetricsEndpoint(const Metrics* metrics);
  ~MetricsEndpoint();

  // Binds HOST:PORT (port 0 picks a free one, returned in `bound_port`) and starts serving. With
  // `scrapers` enabled (a --metrics-token-file), a request without 'Authorization: Bearer <token>' of
  // one of its tokens is answered 401.
  bool Start(const std::string& address, const TokenAuthenticator& scrapers, int* bound_port, std::string* error);
  // /readyz's answer: true once the gRPC service serves, false when it begins to drain.
  void SetReady(bool ready);
  void Stop();

 private:
  const Metrics* metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace tigon::server
