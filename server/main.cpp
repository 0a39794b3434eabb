// tigon-server: parses the flags, connects the engine's log sink to spdlog, starts the Trainer, health
// and reflection services and the metrics endpoint, waits for SIGTERM or SIGINT, then drains.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "server/auth.h"
#include "server/checkpoint_paths.h"
#include "server/parse_errors.h"
#include "server/engine_api.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/options.h"
#include "server/tls.h"
#include "server/trainer_service.h"
#include "tigon/cpu_memory_limit.h"
#include "tigon/engine.h"

#ifndef TIGON_VERSION
#define TIGON_VERSION "0.0.0"
#endif

namespace {

using namespace tigon::server;

void ConfigureLogging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("tigon");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
  tigon::SetLogSink([](tigon::LogLevel engine_level, const std::string& message) {
    spdlog::level::level_enum level = spdlog::level::err;
    switch (engine_level) {
      case tigon::LogLevel::kDebug: level = spdlog::level::debug; break;
      case tigon::LogLevel::kInfo: level = spdlog::level::info; break;
      case tigon::LogLevel::kWarning: level = spdlog::level::warn; break;
      case tigon::LogLevel::kError: level = spdlog::level::err; break;
    }
    spdlog::log(level, "engine: {}", message);
  });
}

std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }

// Why gRPC could not listen on `listen` (it says nothing itself): a bind of the same address, whose
// error names the cause ("Address already in use" for a port another process holds). The flag parser
// has checked that `listen` is HOST:PORT.
std::string ListenProblem(const std::string& listen) {
  std::string host = HostOf(listen);
  const std::string port = listen.substr(host.size() + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return std::string("the address does not resolve: ") + gai_strerror(rc);
  }
  std::string problem = "gRPC refused it";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as gRPC binds
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      problem = std::strerror(errno);
      if (errno == EADDRINUSE) problem += " (another process, perhaps another tigon-server, holds the port)";
    }
    close(fd);
  }
  freeaddrinfo(found);
  return problem;
}

int Run(const ServerOptions& options) {
  // SIGTERM/SIGINT are blocked in every thread (gRPC's included, which inherit the mask) and taken
  // by sigwait below, so no handler runs inside an arbitrary gRPC or engine frame.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::string error;
  TokenAuthenticator auth;
  if (!options.auth_token_file.empty() && !TokenAuthenticator::LoadFromFile(options.auth_token_file, &auth, &error)) {
    spdlog::critical("{}", error);
    return 2;
  }
  TokenAuthenticator scrapers;
  if (!options.metrics_token_file.empty() &&
      !TokenAuthenticator::LoadFromFile(options.metrics_token_file, &scrapers, &error)) {
    spdlog::critical("{}", error);
    return 2;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = MakeServerCredentials(options, &error);
  if (credentials == nullptr) {
    spdlog::critical("{}", error);
    return 2;
  }
  CheckpointRoot checkpoints;
  if (!options.checkpoint_root.empty() && !CheckpointRoot::Open(options.checkpoint_root, &checkpoints, &error)) {
    spdlog::critical("{}", error);
    return 2;
  }
  for (const std::string& leftover : checkpoints.RemoveStaleTemporaries()) {
    spdlog::info("removed '{}' under the checkpoint root: the temporary folder of a save that did not finish",
                 leftover);
  }

  ModelRoots model_roots;
  if (!ModelRoots::Open(options.model_roots, &model_roots, &error)) {
    spdlog::critical("{}", error);
    return 2;
  }

  EngineApi engine = RealEngineApi();
  Metrics metrics(engine.model_families);
  metrics.SetDeviceSource(engine.list_devices);
  ServiceConfig config;
  config.max_sessions = options.max_sessions;
  config.max_batch_tokens = options.max_batch_tokens;
  config.max_message_bytes = options.max_message_bytes;
  config.version = TIGON_VERSION;
  config.session_idle_timeout_seconds = options.session_idle_timeout_seconds;
  config.call_order_timeout_seconds = options.call_order_timeout_seconds;
  config.max_parameters = options.max_parameters;
  config.model_roots = std::move(model_roots);
  if (options.resume_sessions) {
    config.journal = SessionJournal::Open(checkpoints.root(), &error);
    if (config.journal == nullptr) {
      spdlog::critical("{}", error);
      return 2;
    }
  }
  const size_t auth_tokens = auth.size(), auth_admins = auth.admin_count();
  TrainerService service(config, engine, std::move(auth), checkpoints, &metrics);
  // Before the port opens, so that a client's first retry after the restart finds its session.
  if (options.resume_sessions) spdlog::info("--resume-sessions: {} session(s) resumed", service.ResumeSessions());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default, which would let a second server share a port that is in use
  // (each getting part of the calls); refuse to start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.listen, credentials, &port);
  builder.RegisterService(&service);
  builder.experimental().SetInterceptorCreators(RequestInterceptors());  // a request that does not parse
  // Larger requests are refused by gRPC with RESOURCE_EXHAUSTED ("Received message larger than max").
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::critical("cannot listen on {}: {}; choose another with --listen", options.listen,
                     ListenProblem(options.listen));
    return 2;
  }
  const std::string address = HostOf(options.listen) + ":" + std::to_string(port);

  MetricsEndpoint metrics_endpoint(&metrics);
  std::string metrics_address;
  if (!options.metrics_listen.empty()) {
    int metrics_port = 0;
    if (metrics_endpoint.Start(options.metrics_listen, scrapers, &metrics_port, &error)) {
      metrics_address = HostOf(options.metrics_listen) + ":" + std::to_string(metrics_port);
    } else if (options.metrics_listen_given) {
      spdlog::critical("{}", error);
      server->Shutdown();
      return 2;
    } else {
      // Another server on this machine holds the default port: serve training without metrics.
      spdlog::warn("{} (the default --metrics-listen); running without metrics", error);
    }
  }

  server->GetHealthCheckService()->SetServingStatus(true);
  metrics_endpoint.SetReady(true);
  // Machine-readable start lines on stdout (tests and scripts read the ports from them).
  std::printf("tigon-server listening on %s\n", address.c_str());
  if (!metrics_address.empty()) std::printf("tigon-server metrics on http://%s/metrics\n", metrics_address.c_str());
  std::fflush(stdout);
  spdlog::info(
      "tigon-server {} (engine {}) listening on {} ({}); model families: {}; {}; CPU tensor memory cap {}; "
      "auth {}; checkpoints {}; model roots {}; metrics scrape {}",
      TIGON_VERSION, engine.engine_version, address,
      options.tls_cert.empty() ? "plaintext" : (options.tls_client_ca.empty() ? "TLS" : "mutual TLS"),
      [&] {
        std::string s;
        for (auto& f : engine.model_families) s += (s.empty() ? "" : ",") + f;
        return s;
      }(),
      [&] {
        const size_t devices = engine.list_devices().size();
        return devices == 0 ? std::string("no CUDA devices (sessions run on the CPU)")
                            : fmt::format("{} CUDA device(s)", devices);
      }(),
      [] {
        const tigon::CpuMemoryUsage cpu = tigon::GetCpuMemoryUsage();
        return cpu.limit_bytes > 0 ? fmt::format("{:.1f} GiB", cpu.limit_bytes / double(1 << 30)) : std::string("off");
      }(),
      auth_tokens == 0 ? std::string("off")
                       : fmt::format("on ({} tokens, {} admin)", auth_tokens, auth_admins),
      checkpoints.enabled() ? checkpoints.root() : std::string("disabled"),
      [&] {
        std::string s;
        for (auto& root : config.model_roots.roots()) s += (s.empty() ? "" : ", ") + root;
        return s.empty() ? std::string("none") : s;
      }(),
      scrapers.enabled() ? "needs a token" : "open");

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("{}: not serving any more; waiting up to {} s for in-flight calls",
               signal_number == SIGTERM ? "SIGTERM" : "SIGINT", options.exit_timeout_seconds);
  std::thread([stop_signals]() mutable {
    int again = 0;
    sigwait(&stop_signals, &again);
    spdlog::warn("second stop signal: exiting without draining");
    std::_Exit(1);
  }).detach();

  // Health turns NOT_SERVING and new Trainer calls are answered UNAVAILABLE while the port stays open,
  // so probes and clients see the drain; the calls already running get until --exit-timeout.
  server->GetHealthCheckService()->SetServingStatus(false);
  metrics_endpoint.SetReady(false);
  service.BeginDrain();
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options.exit_timeout_seconds * 1000));
  if (!service.WaitForCalls(deadline)) {
    spdlog::warn("--exit-timeout passed with {} call(s) still running; cancelling them", service.calls_in_flight());
  }
  // Closes the port. The Trainer calls are done (or out of time): a short grace lets their last responses
  // go out, then whatever else is open (health, reflection streams) is cancelled; a handler still inside
  // the engine after --exit-timeout finishes its step before Shutdown returns.
  server->Shutdown(std::min(deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(500)));
  server->Wait();
  metrics_endpoint.Stop();
  service.CloseAllSessions();
  spdlog::info("tigon-server stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tigon::server::ServerOptions options;
  std::string error;
  switch (tigon::server::ParseServerOptions(std::vector<std::string>(argv + 1, argv + argc), &options, &error)) {
    case tigon::server::ParseOutcome::kExitOk:
      return 0;
    case tigon::server::ParseOutcome::kPrintVersion:
      std::printf("tigon-server %s (engine %s)\n", TIGON_VERSION, tigon::EngineVersion().c_str());
      return 0;
    case tigon::server::ParseOutcome::kExitError:
      std::fprintf(stderr, "tigon-server: %s\n", error.c_str());
      return 2;
    case tigon::server::ParseOutcome::kRun:
      break;
  }
  ConfigureLogging(options.log_level);
  return Run(options);
}
