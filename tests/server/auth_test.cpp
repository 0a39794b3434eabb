#include "server/auth.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

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
  const std::string path = testing::TempDir() + "tigon_tokens.txt";
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
  const std::string path = testing::TempDir() + "tigon_tokens_empty.txt";
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

}  // namespace
}  // namespace tigon::server
