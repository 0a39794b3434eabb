#include "server/metrics_endpoint.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <prometheus/exposer.h>

#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

namespace tigon::server {
namespace {

// civetweb hands its callbacks only the connection, so the tokens are found by the port the request
// arrived on. A port that is not listed (a request racing the start) is refused, never let through.
std::mutex& ScrapersMutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, TokenAuthenticator>& ScrapersByPort() {
  static std::map<int, TokenAuthenticator> scrapers;
  return scrapers;
}

int Refuse(mg_connection* connection, const char* reason) {
  const std::string body = std::string(reason) + "\n";
  mg_printf(connection,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"tigon-server metrics\"\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
            body.size(), body.c_str());
  return 401;  // non-zero: civetweb treats the request as answered
}

// Runs in a civetweb worker before any handler: the request's bearer token must be one of the port's.
int CheckScraper(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const char* header = mg_get_header(connection, "Authorization");
  if (header == nullptr) return Refuse(connection, "this endpoint needs 'Authorization: Bearer <token>'");
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  metadata.emplace("authorization", grpc::string_ref(header, std::strlen(header)));
  std::lock_guard<std::mutex> lock(ScrapersMutex());
  auto it = ScrapersByPort().find(request->server_port);
  if (it == ScrapersByPort().end() || !it->second.Check(metadata).ok()) {
    return Refuse(connection, "the bearer token is not accepted");
  }
  return 0;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(const Metrics* metrics) : metrics_(metrics) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

bool MetricsEndpoint::Start(const std::string& address, const TokenAuthenticator& scrapers, int* bound_port,
                            std::string* error) {
  // Half-open or slow clients each hold a worker thread until the request timeout; enough workers and
  // a short timeout keep scrapes answered. Keep-alive stays off so that no idle connection keeps a worker.
  std::vector<std::string> options = {"listening_ports",
                                      address,
                                      "num_threads",
                                      std::to_string(kWorkerThreads),
                                      "request_timeout_ms",
                                      std::to_string(kRequestTimeoutMs),
                                      "enable_keep_alive",
                                      "no"};
  CivetCallbacks callbacks;  // its constructor clears every callback
  callbacks.begin_request = CheckScraper;
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(std::move(options), scrapers.enabled() ? &callbacks : nullptr);
  } catch (const std::exception& e) {
    *error = "cannot listen for metrics on " + address + ": " + e.what();
    return false;
  }
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    exposer_.reset();
    *error = "cannot listen for metrics on " + address;
    return false;
  }
  port_ = ports.front();
  if (scrapers.enabled()) {
    std::lock_guard<std::mutex> lock(ScrapersMutex());
    ScrapersByPort()[port_] = scrapers;
  }
  for (const auto& collectable : metrics_->Collectables()) exposer_->RegisterCollectable(collectable);
  *bound_port = port_;
  return true;
}

void MetricsEndpoint::Stop() {
  exposer_.reset();  // stops civetweb and joins its threads
  if (port_ != 0) {
    std::lock_guard<std::mutex> lock(ScrapersMutex());
    ScrapersByPort().erase(port_);
    port_ = 0;
  }
}

}  // namespace tigon::server
