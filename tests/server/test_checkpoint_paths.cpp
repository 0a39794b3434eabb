#include "server/checkpoint_paths.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>

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

  // OpenForSave as an admin (or with authentication off): paths from the root.
  grpc::Status Resolve(const std::string& path, std::string* relative = nullptr, const Caller& caller = kAdmin) {
    CheckpointSaveTarget target;
    auto status = root_.OpenForSave(path, caller, &target);
    if (relative != nullptr) *relative = target.relative;
    if (status.ok()) {
      const fs::path parent = fs::read_symlink("/proc/self/fd/" + std::to_string(target.parent.get()));
      const fs::path base = caller.admin ? fs::canonical(base_ / "root") : fs::canonical(base_ / "root") / caller.name;
      EXPECT_EQ(parent / target.name, base / target.relative);
    }
    return status;
  }
  grpc::Status Load(const std::string& path, const Caller& caller) {
    CheckpointLoadTarget target;
    return root_.OpenForLoad(path, caller, &target);
  }

  static inline const Caller kAdmin{"", true};
  static inline const Caller kAlice{"alice", false};
  static inline const Caller kBob{"bob", false};
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
  EXPECT_EQ(Load("link", kAdmin).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(fs::exists(base_ / "outside" / "ckpt"));
}

TEST_F(CheckpointRootTest, EachUserHasItsOwnNamespace) {
  std::string relative;
  ASSERT_TRUE(Resolve("run/step-1", &relative, kBob).ok());
  EXPECT_EQ(relative, "run/step-1");
  EXPECT_TRUE(fs::is_directory(base_ / "root" / "bob" / "run")) << "created for the save";
  const std::string root = fs::canonical(base_ / "root").string();
  ASSERT_TRUE(Resolve(root + "/bob/abs", &relative, kBob).ok());
  EXPECT_EQ(relative, "abs");
  for (const std::string& path : {std::string("../alice/private"), root + "/alice/private", std::string("../x"),
                                  root + "/top-level"}) {
    auto status = Resolve(path, nullptr, kBob);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << path;
    EXPECT_NE(status.error_message().find("another principal's namespace"), std::string::npos) << path;
    EXPECT_EQ(Load(path, kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED) << path;
  }
  EXPECT_FALSE(fs::exists(base_ / "root" / "alice")) << "nothing created for a refused path";
  EXPECT_EQ(Resolve("../../outside", nullptr, kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Resolve(".", nullptr, kBob).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // An admin reaches every namespace from the root.
  ASSERT_TRUE(Resolve("alice/private", &relative, kAdmin).ok());
  EXPECT_EQ(relative, "alice/private");
  ASSERT_TRUE(Resolve("private", &relative, kAlice).ok());
  EXPECT_EQ(Load("private", kAlice).error_code(), grpc::StatusCode::NOT_FOUND) << "the parent exists, the folder not";
}

TEST_F(CheckpointRootTest, LinksMayNotLeadIntoAnotherNamespace) {
  fs::create_directories(base_ / "root" / "alice" / "private");
  fs::create_directories(base_ / "root" / "bob" / "step-2");
  fs::create_directory_symlink("../alice/private", base_ / "root" / "bob" / "stolen");
  fs::create_directory_symlink(base_ / "root" / "alice", base_ / "root" / "bob" / "absolute");
  EXPECT_EQ(Load("stolen", kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Load("absolute/private", kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Resolve("stolen/sub", nullptr, kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(fs::exists(base_ / "root" / "alice" / "private" / "sub"));
  // A namespace folder that is itself a link is refused.
  fs::create_directory_symlink(base_ / "root" / "alice", base_ / "root" / "mallory");
  EXPECT_EQ(Load("private", Caller{"mallory", false}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A link that stays inside the namespace is followed.
  fs::create_directory_symlink("step-2", base_ / "root" / "bob" / "latest");
  EXPECT_TRUE(Load("latest", kBob).ok());
}

TEST_F(CheckpointRootTest, ModelPathsAreLocatedInTheCallersNamespace) {
  const fs::path root = fs::canonical(base_ / "root");
  std::string folder, space;
  ASSERT_TRUE(root_.LocateFolder("mine", kBob, &folder, &space).ok());
  EXPECT_EQ(folder, (root / "bob" / "mine").string());
  EXPECT_EQ(space, (root / "bob").string()) << "links must stay inside Bob's folder";
  EXPECT_EQ(root_.LocateFolder((root / "alice" / "private").string(), kBob, &folder, &space).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(root_.LocateFolder("../alice/private", kBob, &folder, &space).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(root_.LocateFolder("alice/private", kAdmin, &folder, &space).ok());
  EXPECT_EQ(folder, (root / "alice" / "private").string());
  EXPECT_EQ(space, root.string());
}

TEST_F(CheckpointRootTest, TheHeldParentIsWhereTheSaveGoesWhateverIsSwappedIn) {
  const fs::path root = fs::canonical(base_ / "root");
  CheckpointSaveTarget target;
  ASSERT_TRUE(root_.OpenForSave("run/step-1", kBob, &target).ok());
  // The folder is moved away and a link to outside the root takes its name.
  fs::rename(root / "bob" / "run", root / "bob" / "moved");
  fs::create_directory_symlink(base_ / "outside", root / "bob" / "run");
  ASSERT_EQ(::mkdirat(target.parent.get(), target.name.c_str(), 0755), 0);
  EXPECT_TRUE(fs::is_directory(root / "bob" / "moved" / "step-1"));
  EXPECT_FALSE(fs::exists(base_ / "outside" / "step-1"));
  EXPECT_EQ(root_.CheckStillInPlace(target).error_code(), grpc::StatusCode::ABORTED);
  CheckpointSaveTarget unmoved;
  ASSERT_TRUE(root_.OpenForSave("moved/step-2", kBob, &unmoved).ok());
  EXPECT_TRUE(root_.CheckStillInPlace(unmoved).ok());
}

TEST_F(CheckpointRootTest, AbsurdPathsAreInvalidAndEchoedEscaped) {
  EXPECT_EQ(Resolve(std::string(CheckpointRoot::kMaxPathBytes + 1, 'a')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve(std::string(256, 'a') + "/x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto status = Resolve("../forged\nERROR line");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message().find('\n'), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("forged\\nERROR"), std::string::npos) << status.error_message();
}

TEST_F(CheckpointRootTest, EmptyRootItselfAndNulAreInvalid) {
  EXPECT_EQ(Resolve("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve(".").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve("a/..").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Resolve(std::string("a\0b", 3)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(CheckpointRoot, DisabledIsFailedPrecondition) {
  CheckpointRoot disabled;
  CheckpointLocation location;
  auto status = disabled.Locate("x", Caller{"", true}, &location);
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
