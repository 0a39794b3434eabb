#include "server/checkpoint_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace tigon::server {
namespace {
namespace fs = std::filesystem;

class CheckpointRootTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(testing::TempDir()) / ("tigon_ckpt_" + std::to_string(::getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_ / "outside");
    std::string error;
    ASSERT_TRUE(CheckpointRoot::Open((base_ / "root").string(), &root_, &error)) << error;
  }
  void TearDown() override { fs::remove_all(base_); }

  grpc::Status Resolve(const std::string& path, std::string* relative = nullptr) {
    std::string absolute, rel;
    auto status = root_.Resolve(path, &absolute, &rel);
    if (relative != nullptr) *relative = rel;
    if (status.ok()) {
      EXPECT_EQ(fs::path(absolute), fs::canonical(base_ / "root") / rel);
    }
    return status;
  }

  fs::path base_;
  CheckpointRoot root_;
};

TEST_F(CheckpointRootTest, OpenCreatesTheRoot) { EXPECT_TRUE(fs::is_directory(base_ / "root")); }

TEST_F(CheckpointRootTest, RelativePathsResolveInsideTheRoot) {
  std::string relative;
  ASSERT_TRUE(Resolve("run1/step-10", &relative).ok());
  EXPECT_EQ(relative, "run1/step-10");
  ASSERT_TRUE(Resolve("run1/../run2/", &relative).ok());
  EXPECT_EQ(relative, "run2");
  ASSERT_TRUE(Resolve((fs::canonical(base_ / "root") / "abs").string(), &relative).ok());
  EXPECT_EQ(relative, "abs");
}

TEST_F(CheckpointRootTest, EscapesArePermissionDenied) {
  for (const std::string& path : std::vector<std::string>{"../outside", "a/../../outside", "..", "/etc/passwd",
                                                          (base_ / "outside").string(), "./../root2"}) {
    EXPECT_EQ(Resolve(path).error_code(), grpc::StatusCode::PERMISSION_DENIED) << path;
  }
}

TEST_F(CheckpointRootTest, SymbolicLinksOutOfTheRootAreRefused) {
  fs::create_directory_symlink(base_ / "outside", base_ / "root" / "link");
  EXPECT_EQ(Resolve("link/ckpt").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Resolve("link").error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(CheckpointRootTest, EmptyRootItselfAndNulAreInvalid) {
  EXPECT_EQ(Resolve("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve(".").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve("a/..").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve(std::string("a\0b", 3)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(CheckpointRoot, DisabledIsFailedPrecondition) {
  CheckpointRoot disabled;
  std::string absolute, relative;
  auto status = disabled.Resolve("x", &absolute, &relative);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("--checkpoint-root"), std::string::npos);
}


TEST_F(CheckpointRootTest, TemporaryFoldersOfUnfinishedSavesAreNotCheckpoints) {
  int64_t pid = 0;
  EXPECT_TRUE(CheckpointRoot::IsTemporaryName("step-4.tmp-1234-0", &pid));
  EXPECT_EQ(pid, 1234);
  for (const char* name : {"step-4", "step-4.tmp", "step-4.tmp-12", "step-4.tmp-a-0", ".tmp-1-2", "x.tmp-1-2b"}) {
    EXPECT_FALSE(CheckpointRoot::IsTemporaryName(name)) << name;
  }
  EXPECT_EQ(Resolve("run/step-4.tmp-1234-0").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve("run.tmp-1-0/step-4").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Resolve("run/step-4.tmp").ok());
}

TEST_F(CheckpointRootTest, StaleTemporariesAreRemovedLiveOnesAndCheckpointsKept) {
  const fs::path root = fs::canonical(base_ / "root");
  // pid 2^22 + 1 is above Linux's largest pid (pid_max <= 2^22): no such process runs.
  const std::string dead = ".tmp-" + std::to_string((1 << 22) + 1) + "-0";
  const std::string live = ".tmp-" + std::to_string(::getpid()) + "-3";
  fs::create_directories(root / "run" / "step-1");
  fs::create_directories(root / "run" / ("step-2" + dead));
  std::ofstream(root / "run" / ("step-2" + dead) / "model.safetensors") << "half";
  fs::create_directories(root / ("top" + dead));
  fs::create_directories(root / "run" / ("step-3" + live));
  auto removed = root_.RemoveStaleTemporaries();
  std::sort(removed.begin(), removed.end());
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_EQ(removed[0], "run/step-2" + dead);
  EXPECT_EQ(removed[1], "top" + dead);
  EXPECT_FALSE(fs::exists(root / "run" / ("step-2" + dead)));
  EXPECT_FALSE(fs::exists(root / ("top" + dead)));
  EXPECT_TRUE(fs::exists(root / "run" / "step-1"));
  EXPECT_TRUE(fs::exists(root / "run" / ("step-3" + live))) << "a running process may still be writing it";
  EXPECT_TRUE(root_.RemoveStaleTemporaries().empty());
}

}  // namespace
}  // namespace tigon::server
