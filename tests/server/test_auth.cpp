#include "server/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <unistd.h>

namespace tigon::server {
namespace {

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

grpc::Status CheckWith(const TokenAuthenticator& auth, const std::vector<std::string>& values) {
  Metadata metadata;
  for (const auto& v : values) metadata.emplace("authorization", v);
  return auth.Check(metadata);
}

TEST(TokenAuthenticator, DisabledLetsEveryCallThrough) {
  TokenAuthenticator auth;
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(CheckWith(auth, {}).ok());
}

TEST(TokenAuthenticator, MissingMalformedAndWrongTokensAreUnauthenticated) {
  TokenAuthenticator auth({"s3cret"});
  auto missing = CheckWith(auth, {});
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(missing.error_message().find("missing"), std::string::npos);
  auto basic = CheckWith(auth, {"Basic s3cret"});
  EXPECT_EQ(basic.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(basic.error_message().find("Bearer"), std::string::npos);
  for (const char* wrong : {"Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET", "Bearer ", "Bearer"}) {
    auto status = CheckWith(auth, {wrong});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong;
    EXPECT_EQ(status.error_message().find("s3cret"), std::string::npos) << "the token leaked";
  }
}

TEST(TokenAuthenticator, TheRightTokenPassesWhateverTheSchemeCase) {
  TokenAuthenticator auth({"s3cret"});
  EXPECT_TRUE(CheckWith(auth, {"Bearer s3cret"}).ok());
  EXPECT_TRUE(CheckWith(auth, {"bearer s3cret"}).ok());
  EXPECT_TRUE(CheckWith(auth, {"Bearer wrong", "Bearer s3cret"}).ok());
}

TEST(TokenAuthenticator, FileHoldsSeveralTokensCommentsAndBlankLines) {
  const std::string path = testing::TempDir() + "tigon_tokens_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    out << "# rotation: old and new\n\n  old-token  \nnew-token\n";
  }
  TokenAuthenticator auth;
  std::string error;
  ASSERT_TRUE(TokenAuthenticator::LoadFromFile(path, &auth, &error)) << error;
  EXPECT_TRUE(CheckWith(auth, {"Bearer old-token"}).ok());
  EXPECT_TRUE(CheckWith(auth, {"Bearer new-token"}).ok());
  EXPECT_FALSE(CheckWith(auth, {"Bearer # rotation: old and new"}).ok());
  std::remove(path.c_str());
}

TEST(TokenAuthenticator, EmptyOrMissingFileIsAnError) {
  const std::string path = testing::TempDir() + "tigon_tokens_empty_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    out << "# nothing\n\n";
  }
  TokenAuthenticator auth;
  std::string error;
  EXPECT_FALSE(TokenAuthenticator::LoadFromFile(path, &auth, &error));
  EXPECT_NE(error.find("no token"), std::string::npos) << error;
  EXPECT_FALSE(TokenAuthenticator::LoadFromFile(path + ".missing", &auth, &error));
  std::remove(path.c_str());
}


// The role format: `TOKEN ROLE NAME` lines next to bare tokens (the original format).
TEST(TokenAuthenticator, RolesAndNamesFromTheFile) {
  TokenAuthenticator auth;
  std::string error;
  ASSERT_TRUE(TokenAuthenticator::Parse("# bare: the user 'default'\nlegacy-1\nlegacy-2\n"
                                        "a1 user alice\n  a2\tuser   alice  \nops-key admin ops@example.com\n",
                                        "tokens", &auth, &error))
      << error;
  EXPECT_EQ(auth.size(), 5u);
  EXPECT_EQ(auth.admin_count(), 1u);
  auto caller_of = [&](const std::string& token) {
    Metadata metadata;
    const std::string value = "Bearer " + token;
    metadata.emplace("authorization", value);
    Caller caller;
    EXPECT_TRUE(auth.Authenticate(metadata, &caller).ok()) << token;
    return caller;
  };
  EXPECT_EQ(caller_of("legacy-1").name, "default");
  EXPECT_EQ(caller_of("legacy-2").name, "default");
  EXPECT_FALSE(caller_of("legacy-1").admin);
  EXPECT_EQ(caller_of("a1").name, "alice");
  EXPECT_EQ(caller_of("a2").name, "alice");
  EXPECT_FALSE(caller_of("a2").admin);
  EXPECT_EQ(caller_of("ops-key").name, "ops@example.com");
  EXPECT_TRUE(caller_of("ops-key").admin);
  EXPECT_FALSE(CheckWith(auth, {"Bearer user"}).ok()) << "a role is not a token";
  EXPECT_FALSE(CheckWith(auth, {"Bearer alice"}).ok()) << "a name is not a token";
}

TEST(TokenAuthenticator, MalformedRoleLinesAreErrorsNamingTheLine) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"t1 user\n", "line 1 has 2 fields"},
      {"ok\nt1 owner bob\n", "line 2: the role 'owner'"},
      {"t1 admin bo/b\n", "the name 'bo/b'"},
      {"t1 user a b\n", "has 4 fields"},
      {"same\nsame user x\n", "line 2 repeats a token"},
      {"t1\x01 user x\n", "control characters"},
  };
  for (const auto& [text, fragment] : bad) {
    TokenAuthenticator auth;
    std::string error;
    EXPECT_FALSE(TokenAuthenticator::Parse(text, "tokens", &auth, &error)) << text;
    EXPECT_NE(error.find(fragment), std::string::npos) << error;
    EXPECT_EQ(error.find("t1"), std::string::npos) << "a token leaked into: " << error;
  }
}

TEST(TokenAuthenticator, DisabledAuthMakesEveryCallerTheAnonymousAdmin) {
  TokenAuthenticator auth;
  Caller caller;
  ASSERT_TRUE(auth.Authenticate({}, &caller).ok());
  EXPECT_TRUE(caller.admin);
  EXPECT_TRUE(MayUseSession(caller, "anyone"));
  EXPECT_TRUE(MayUseSession(Caller{"alice", false}, "alice"));
  EXPECT_FALSE(MayUseSession(Caller{"bob", false}, "alice"));
  EXPECT_TRUE(MayUseSession(Caller{"root", true}, "alice"));
}

}  // namespace
}  // namespace tigon::server
