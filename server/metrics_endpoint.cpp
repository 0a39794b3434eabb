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

// civetweb hands its callbacks only the connection, so a port's tokens and readiness are found by the
// port the request arrived on. A port that is not listed (a request racing the start) is refused, never
// let through.
struct PortState {
  TokenAuthenticator scrapers;  // not enabled: /metrics is open
  bool ready = false;
};
std::mutex& PortsMutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, PortState>& Ports() {
  static std::map<int, PortState> ports;
  return ports;
}

int Answer(mg_connection* connection, int code, const char* status, const std::string& text) {
  const std::string body = text + "\n";
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n%s",
            code, status, body.size(), body.c_str());
  return code;  // non-zero: civetweb treats the request as answered
}

int Refuse(mg_connection* connection, const char* reason) {
  const std::string body = std::string(reason) + "\n";
  mg_printf(connection,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"tigon-server metrics\"\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
            body.size(), body.c_str());
  return 401;  // non-zero: civetweb treats the request as answered
}

// Runs in a civetweb worker before any handler. /healthz (the process serves HTTP) and /readyz (the
// gRPC service takes calls: started and not draining) are answered here, without a token, as Kubernetes
// probes expect; they say nothing about sessions. Anything else needs one of the port's bearer tokens
// when it has some, and then goes on to prometheus-cpp's /metrics handler.
int BeforeRequest(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string uri = request->local_uri != nullptr ? request->local_uri : "";
  std::lock_guard<std::mutex> lock(PortsMutex());
  auto it = Ports().find(request->server_port);
  if (uri == "/healthz") return Answer(connection, 200, "OK", "ok");
  if (uri == "/readyz") {
    const bool ready = it != Ports().end() && it->second.ready;
    return ready ? Answer(connection, 200, "OK", "ready")
                 : Answer(connection, 503, "Service Unavailable", "not ready: starting or draining");
  }
  if (it == Ports().end()) return Answer(connection, 503, "Service Unavailable", "starting");
  if (!it->second.scrapers.enabled()) return 0;
  const char* header = mg_get_header(connection, "Authorization");
  if (header == nullptr) return Refuse(connection, "this endpoint needs 'Authorization: Bearer <token>'");
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  metadata.emplace("authorization", grpc::string_ref(header, std::strlen(header)));
  if (!it->second.scrapers.Check(metadata).ok()) return Refuse(connection, "the bearer token is not accepted");
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
  callbacks.begin_request = BeforeRequest;
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(std::move(options), &callbacks);
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
  {
    std::lock_guard<std::mutex> lock(PortsMutex());
    Ports()[port_].scrapers = scrapers;
  }
  for (const auto& collectable : metrics_->Collectables()) exposer_->RegisterCollectable(collectable);
  *bound_port = port_;
  return true;
}

void MetricsEndpoint::SetReady(bool ready) {
  std::lock_guard<std::mutex> lock(PortsMutex());
  if (auto it = Ports().find(port_); port_ != 0 && it != Ports().end()) it->second.ready = ready;
}

void MetricsEndpoint::Stop() {
  exposer_.reset();  // stops civetweb and joins its threads
  if (port_ != 0) {
    std::lock_guard<std::mutex> lock(PortsMutex());
    Ports().erase(port_);
    port_ = 0;
  }
}

}  // namespace tigon::server
