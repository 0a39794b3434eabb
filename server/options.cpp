#include "server/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>

namespace tigon::server {
namespace {

bool ParseInt(const std::string& text, int64_t min_value, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < min_value) return false;
  *out = value;
  return true;
}

bool ParseSeconds(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(value) || value < 0) return false;
  *out = value;
  return true;
}

// HOST:PORT with a numeric port in [0, 65535]; HOST may be a bracketed IPv6 address.
bool ValidListenAddress(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int64_t port = 0;
  return ParseInt(address.substr(colon + 1), 0, &port) && port <= 65535;
}

struct Flag {
  const char* name;
  const char* value_name;
  const char* help;
  std::function<bool(const std::string&, ServerOptions*)> set;
};

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      {"listen", "HOST:PORT",
       "address of the gRPC service (default 127.0.0.1:50051); port 0 picks a free port, printed "
       "on stdout as 'tigon-server listening on HOST:PORT'",
       [](const std::string& v, ServerOptions* o) {
         o->listen = v;
         return ValidListenAddress(v);
       }},
      {"auth-token-file", "FILE",
       "file with the accepted bearer tokens, one per line as 'TOKEN' or 'TOKEN ROLE NAME' (ROLE: user "
       "or admin); every Trainer call then needs 'authorization: Bearer <token>' metadata, and a "
       "session's calls need a token of the name that created it or an admin token (health and "
       "reflection stay open)",
       [](const std::string& v, ServerOptions* o) {
         o->auth_token_file = v;
         return !v.empty();
       }},
      {"checkpoint-root", "DIR",
       "directory that holds every checkpoint; request paths are resolved inside it and paths that "
       "escape it are refused with PERMISSION_DENIED (default: checkpoints disabled)",
       [](const std::string& v, ServerOptions* o) {
         o->checkpoint_root = v;
         return !v.empty();
       }},
      {"model-root", "DIR",
       "a folder of Hugging Face model folders (repeatable, tried in the order given): CreateSession's "
       "model_path may name a folder inside one, relative to it or as an absolute path, and nothing "
       "outside (symbolic links that lead out of the root are refused). Without it model_path reaches "
       "only the caller's checkpoints under --checkpoint-root",
       [](const std::string& v, ServerOptions* o) {
         o->model_roots.push_back(v);
         return !v.empty();
       }},
      {"max-sessions", "N", "most sessions open at once (default 16)",
       [](const std::string& v, ServerOptions* o) { return ParseInt(v, 1, &o->max_sessions); }},
      {"max-batch-tokens", "N", "most tokens (batch * seq_len) in one request (default 262144)",
       [](const std::string& v, ServerOptions* o) { return ParseInt(v, 1, &o->max_batch_tokens); }},
      {"max-message-bytes", "N", "largest request message accepted, in bytes (default 67108864)",
       [](const std::string& v, ServerOptions* o) {
         return ParseInt(v, 1024, &o->max_message_bytes) && o->max_message_bytes <= INT32_MAX;
       }},
      {"log-level", "LEVEL", "trace, debug, info, warn, error or off (default info)",
       [](const std::string& v, ServerOptions* o) {
         o->log_level = v;
         for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
           if (v == level) return true;
         }
         return false;
       }},
      {"exit-timeout", "SECONDS",
       "on SIGTERM/SIGINT, how long in-flight calls may take to finish before they are cancelled "
       "(default 60)",
       [](const std::string& v, ServerOptions* o) { return ParseSeconds(v, &o->exit_timeout_seconds); }},
      {"call-order-timeout", "SECONDS",
       "how long a call numbered in its client's order (CallOrder) waits for an earlier call that has not "
       "reached the server at all, before it and the later calls of that client are refused ABORTED "
       "(default 30)",
       [](const std::string& v, ServerOptions* o) { return ParseSeconds(v, &o->call_order_timeout_seconds); }},
      {"session-idle-timeout", "SECONDS",
       "close a session that has had no call for this long, freeing its memory when its client is gone "
       "(default 0: never)",
       [](const std::string& v, ServerOptions* o) { return ParseSeconds(v, &o->session_idle_timeout_seconds); }},
      {"max-parameters", "N",
       "largest model a session may have, in parameters, estimated from its config before anything is "
       "allocated (RESOURCE_EXHAUSTED above it; default 100000000000; 0: no limit)",
       [](const std::string& v, ServerOptions* o) { return ParseInt(v, 0, &o->max_parameters); }},
      {"tls-cert", "FILE",
       "PEM certificate chain of the server: the gRPC port then speaks TLS only (needs --tls-key)",
       [](const std::string& v, ServerOptions* o) {
         o->tls_cert = v;
         return !v.empty();
       }},
      {"tls-key", "FILE", "PEM private key of --tls-cert",
       [](const std::string& v, ServerOptions* o) {
         o->tls_key = v;
         return !v.empty();
       }},
      {"tls-client-ca", "FILE",
       "PEM certificate(s) of the CA that signs client certificates: mutual TLS, a client without a "
       "certificate signed by it is refused during the handshake (needs --tls-cert)",
       [](const std::string& v, ServerOptions* o) {
         o->tls_client_ca = v;
         return !v.empty();
       }},
      {"metrics-listen", "HOST:PORT",
       "address of the Prometheus /metrics endpoint (default 127.0.0.1:9464, skipped with a warning "
       "when taken; port 0 picks a free port; 'off' disables it)",
       [](const std::string& v, ServerOptions* o) {
         if (v == "off") {
           o->metrics_listen.clear();
           o->metrics_listen_given = true;
           return true;
         }
         o->metrics_listen = v;
         o->metrics_listen_given = true;
         return ValidListenAddress(v);
       }},
      {"resume-sessions", "",
       "(a switch; needs --checkpoint-root) note each session under <checkpoint-root>/+sessions, and at "
       "start bring back every session noted there that saved (or loaded) a checkpoint: same id and owner, "
       "at that checkpoint's step. Lost: the steps after it, pending gradients, remembered request ids; "
       "a session that never saved does not come back",
       [](const std::string& v, ServerOptions* o) {
         if (v != "true" && v != "false") return false;
         o->resume_sessions = v == "true";
         return true;
       }},
      {"metrics-token-file", "FILE",
       "file with the bearer tokens that may scrape the metrics endpoint, in the --auth-token-file format "
       "(one token per line serves as Prometheus' authorization.credentials_file); every request then needs "
       "'Authorization: Bearer <token>', otherwise 401 (default: the endpoint, which shows session ids and "
       "losses, is open to whoever reaches its port)",
       [](const std::string& v, ServerOptions* o) {
         o->metrics_token_file = v;
         return !v.empty();
       }},
  };
  return flags;
}

}  // namespace

std::string HelpText() {
  std::ostringstream out;
  out << "Usage: tigon-server [FLAGS]\n\n"
         "Serves the tigon.v1.Trainer gRPC service, grpc.health.v1 and server reflection.\n"
         "SIGTERM or SIGINT: health turns NOT_SERVING, new calls are refused, in-flight steps finish,\n"
         "then the process exits 0.\n\nFlags (--flag VALUE or --flag=VALUE):\n";
  for (const Flag& flag : Flags()) {
    out << "  --" << flag.name << " " << flag.value_name << "\n      " << flag.help << "\n";
  }
  out << "  --help\n      print this text and exit\n";
  out << "  --version\n      print the server's and the engine's versions and exit\n";
  return out.str();
}

ParseOutcome ParseServerOptions(const std::vector<std::string>& args, ServerOptions* options, std::string* error) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << HelpText();
      return ParseOutcome::kExitOk;
    }
    if (arg == "--version") return ParseOutcome::kPrintVersion;
    if (arg.rfind("--", 0) != 0) {
      *error = "unexpected argument '" + arg + "' (see --help)";
      return ParseOutcome::kExitError;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& candidate : Flags()) {
      if (name == candidate.name) flag = &candidate;
    }
    if (flag == nullptr) {
      *error = "unknown flag --" + name + " (see --help)";
      return ParseOutcome::kExitError;
    }
    if (!has_value && *flag->value_name == '\0') {  // a switch: --flag alone means --flag=true
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        *error = "flag --" + name + " needs a value " + flag->value_name;
        return ParseOutcome::kExitError;
      }
      value = args[++i];
    }
    if (!flag->set(value, options)) {
      *error = "bad value '" + value + "' for --" + name + " (expected " + flag->value_name + ")";
      return ParseOutcome::kExitError;
    }
  }
  if (options->tls_cert.empty() != options->tls_key.empty()) {
    *error = "--tls-cert and --tls-key go together: give both or neither";
    return ParseOutcome::kExitError;
  }
  if (options->resume_sessions && options->checkpoint_root.empty()) {
    *error = "--resume-sessions needs --checkpoint-root, where sessions are noted and checkpoints kept";
    return ParseOutcome::kExitError;
  }
  if (!options->tls_client_ca.empty() && options->tls_cert.empty()) {
    *error = "--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key";
    return ParseOutcome::kExitError;
  }
  return ParseOutcome::kRun;
}

}  // namespace tigon::server
