#include "server/options.h"

#include <gtest/gtest.h>

namespace tigon::server {
namespace {

ParseOutcome Parse(std::vector<std::string> args, ServerOptions* options, std::string* error) {
  return ParseServerOptions(args, options, error);
}

TEST(ServerOptions, DefaultsWhenNoFlags) {
  ServerOptions options;
  std::string error;
  ASSERT_EQ(Parse({}, &options, &error), ParseOutcome::kRun);
  EXPECT_EQ(options.listen, "127.0.0.1:50051");
  EXPECT_EQ(options.metrics_listen, "127.0.0.1:9464");
  EXPECT_TRUE(options.auth_token_file.empty());
  EXPECT_TRUE(options.checkpoint_root.empty());
  EXPECT_EQ(options.log_level, "info");
}

TEST(ServerOptions, BothFlagSpellingsAreAccepted) {
  ServerOptions options;
  std::string error;
  ASSERT_EQ(Parse({"--listen=0.0.0.0:0", "--max-sessions", "3", "--max-batch-tokens=4096", "--max-message-bytes",
                   "2048", "--log-level=debug", "--exit-timeout", "2.5", "--auth-token-file=/tmp/t",
                   "--checkpoint-root", "/tmp/c", "--metrics-listen=off", "--session-idle-timeout=600"},
                  &options, &error),
            ParseOutcome::kRun)
      << error;
  EXPECT_EQ(options.listen, "0.0.0.0:0");
  EXPECT_EQ(options.max_sessions, 3);
  EXPECT_EQ(options.max_batch_tokens, 4096);
  EXPECT_EQ(options.max_message_bytes, 2048);
  EXPECT_EQ(options.log_level, "debug");
  EXPECT_DOUBLE_EQ(options.exit_timeout_seconds, 2.5);
  EXPECT_EQ(options.auth_token_file, "/tmp/t");
  EXPECT_EQ(options.checkpoint_root, "/tmp/c");
  EXPECT_TRUE(options.metrics_listen.empty());
  EXPECT_DOUBLE_EQ(options.session_idle_timeout_seconds, 600);
}

TEST(ServerOptions, BadValuesAreRefusedWithTheFlagName) {
  const std::vector<std::vector<std::string>> bad = {{"--listen=nohost"},
                                                     {"--listen=host:99999"},
                                                     {"--max-sessions=0"},
                                                     {"--max-sessions=abc"},
                                                     {"--max-batch-tokens=-5"},
                                                     {"--log-level=loud"},
                                                     {"--exit-timeout=-1"},
                                                     {"--max-message-bytes=10"},
                                                     {"--bogus=1"},
                                                     {"--listen"},
                                                     {"positional"},
                                                     {"--metrics-listen=x"}};
  for (const auto& args : bad) {
    ServerOptions options;
    std::string error;
    EXPECT_EQ(Parse(args, &options, &error), ParseOutcome::kExitError) << args[0];
    EXPECT_FALSE(error.empty()) << args[0];
  }
  ServerOptions options;
  std::string error;
  Parse({"--max-sessions=0"}, &options, &error);
  EXPECT_NE(error.find("--max-sessions"), std::string::npos) << error;
}

TEST(ServerOptions, HelpNamesEveryFlag) {
  const std::string help = HelpText();
  for (const char* flag : {"--listen", "--auth-token-file", "--checkpoint-root", "--max-sessions", "--max-batch-tokens",
                           "--max-message-bytes", "--log-level", "--exit-timeout", "--metrics-listen",
                           "--session-idle-timeout", "--help"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
  ServerOptions options;
  std::string error;
  testing::internal::CaptureStdout();
  EXPECT_EQ(Parse({"--help"}, &options, &error), ParseOutcome::kExitOk);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), help);
}


TEST(ServerOptions, TlsFlagsGoTogether) {
  ServerOptions options;
  std::string error;
  ASSERT_EQ(Parse({"--tls-cert=/c.pem", "--tls-key", "/k.pem", "--tls-client-ca=/ca.pem", "--max-parameters=5000"},
                  &options, &error),
            ParseOutcome::kRun)
      << error;
  EXPECT_EQ(options.tls_cert, "/c.pem");
  EXPECT_EQ(options.tls_key, "/k.pem");
  EXPECT_EQ(options.tls_client_ca, "/ca.pem");
  EXPECT_EQ(options.max_parameters, 5000);
  EXPECT_EQ(ServerOptions().max_parameters, 100'000'000'000) << "on by default, past one GPU's reach";

  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--tls-cert=/c.pem"}, "--tls-key"},
      {{"--tls-key=/k.pem"}, "--tls-cert"},
      {{"--tls-client-ca=/ca.pem"}, "--tls-client-ca"},
      {{"--tls-cert="}, "--tls-cert"},
      {{"--max-parameters=-1"}, "--max-parameters"},
  };
  for (const auto& [args, fragment] : bad) {
    ServerOptions o;
    std::string e;
    EXPECT_EQ(Parse(args, &o, &e), ParseOutcome::kExitError) << args[0];
    EXPECT_NE(e.find(fragment), std::string::npos) << e;
  }
  const std::string help = HelpText();
  for (const char* flag : {"--tls-cert", "--tls-key", "--tls-client-ca", "--max-parameters"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace tigon::server
