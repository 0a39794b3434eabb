#include "server/metrics_endpoint.h"

#include <httplib.h>
#include <sys/socket.h>

namespace tigon::server {

MetricsEndpoint::MetricsEndpoint(const Metrics* metrics) : metrics_(metrics) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

bool MetricsEndpoint::Start(const std::string& address, int* bound_port, std::string* error) {
  const auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const int port = std::stoi(address.substr(colon + 1));
  http_ = std::make_unique<httplib::Server>();
  // httplib's default adds SO_REUSEPORT, which lets a second server share a port in use; keep only
  // SO_REUSEADDR so that binding a taken port fails.
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("tigon-server: metrics at /metrics\n", "text/plain");
  });
  int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    *error = "cannot listen for metrics on " + address;
    http_.reset();
    return false;
  }
  *bound_port = bound;
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return true;
}

void MetricsEndpoint::Stop() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
  http_.reset();
}

}  // namespace tigon::server
