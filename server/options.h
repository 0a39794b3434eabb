// tigon-server's command-line options: a plain struct with the defaults, filled from argv.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tigon::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // HOST:PORT; port 0 picks a free port (printed at start)
  std::string auth_token_file;             // empty: no authentication
  bool resume_sessions = false;            // --resume-sessions
  std::string checkpoint_root;             // empty: Save/LoadCheckpoint answer FAILED_PRECONDITION
  // Folders whose model folders CreateSession's model_path may name (--model-root, repeatable). With
  // none, model_path reaches only the caller's checkpoints (and is off without --checkpoint-root).
  std::vector<std::string> model_roots;
  int64_t max_sessions = 16;
  int64_t max_batch_tokens = 262144;              // batch * seq_len per request
  int64_t max_message_bytes = 64 << 20;           // largest request accepted (RESOURCE_EXHAUSTED above it)
  std::string log_level = "info";                 // trace | debug | info | warn | error | off
  double exit_timeout_seconds = 60.0;             // on SIGTERM: how long in-flight calls may take to finish
  double call_order_timeout_seconds = 30.0;       // a numbered call's wait for an earlier one that never came
  double session_idle_timeout_seconds = 0;        // close sessions without a call for this long; 0 = never
  std::string metrics_listen = "127.0.0.1:9464";  // Prometheus /metrics; empty: off
  bool metrics_listen_given = false;              // the default address may be taken (then: no metrics, a warning)
  std::string metrics_token_file;                 // empty: /metrics is open to whoever reaches the port
  // Largest model CreateSession builds, in parameters (estimated from the config before anything is
  // allocated); 0 = no limit. The default is past what one 141 GiB GPU can train.
  int64_t max_parameters = 100'000'000'000;
  // TLS: the server's certificate chain and private key (PEM); both or neither. With tls_client_ca
  // (PEM of the CA that signs client certificates) every client must present a certificate it signed.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
};

enum class ParseOutcome { kRun, kExitOk, kExitError, kPrintVersion };

// Parses "--flag value" and "--flag=value". On --help prints HelpText() to stdout and returns
// kExitOk; --version returns kPrintVersion (the caller knows the version); on a bad flag writes the
// reason to `error` and returns kExitError.
ParseOutcome ParseServerOptions(const std::vector<std::string>& args, ServerOptions* options, std::string* error);

std::string HelpText();

}  // namespace tigon::server
