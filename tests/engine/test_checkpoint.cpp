// Checkpoints through engine.h: exact resume in a fresh process, atomic replacement, Hugging Face-loadable
// weights, and refusals that leave the session unchanged.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine_test_util.h"

extern char** environ;

namespace tigon {
namespace {

namespace fs = std::filesystem;
using testing::RandomBatch;
using testing::TinyOptions;

std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("tigon_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::unique_ptr<Session> MakeSession(const SessionOptions& options) {
  std::unique_ptr<Session> session;
  Status status = CreateSession(options, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

constexpr int kResumeSteps = 5;

}  // namespace

std::vector<double> TrainSteps(Session& session, int first_step, int n) {
  std::vector<double> losses;
  for (int i = 0; i < n; ++i) {
    StepStats stats;
    Status status = session.TrainStep(RandomBatch(2, 16, 1000 + first_step + i), {}, &stats);
    EXPECT_TRUE(status.ok()) << status.ToString();
    losses.push_back(stats.loss);
  }
  return losses;
}

// The child process of ResumeIsExactInAFreshProcess: loads the checkpoint, trains, writes the losses.
int ResumeChildMain(const char* checkpoint, const char* output) {
  std::unique_ptr<Session> session;
  Status status = CreateSession(TinyOptions("bf16_mixed"), &session);
  if (status.ok()) status = session->LoadCheckpoint(checkpoint);
  if (!status.ok() || session->Info().step != 10) {
    std::fprintf(stderr, "resume child: %s, step %lld\n", status.ToString().c_str(),
                 session ? static_cast<long long>(session->Info().step) : -1LL);
    return 1;
  }
  std::ofstream out(output);
  out.precision(17);
  for (double loss : TrainSteps(*session, 10, kResumeSteps)) out << loss << "\n";
  return out ? 0 : 1;
}

namespace {

TEST(Checkpoint, ResumeIsExactInAFreshProcess) {
  const std::string dir = TempDir("resume");
  auto session = MakeSession(TinyOptions("bf16_mixed"));
  TrainSteps(*session, 0, 10);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/ckpt").ok());
  auto expected = TrainSteps(*session, 10, kResumeSteps);

  const std::string output = dir + "/child_losses.txt";
  std::string env_ckpt = "TIGON_RESUME_CHECKPOINT=" + dir + "/ckpt";
  std::string env_out = "TIGON_RESUME_OUTPUT=" + output;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  envp.push_back(env_ckpt.data());
  envp.push_back(env_out.data());
  envp.push_back(nullptr);
  // The same test binary; main() sees the environment and runs ResumeChildMain instead of the tests.
  std::string self = fs::read_symlink("/proc/self/exe").string();
  char* argv[] = {self.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child failed";

  std::ifstream in(output);
  std::vector<double> resumed;
  for (double v; in >> v;) resumed.push_back(v);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << 10 + i;
  fs::remove_all(dir);
}

TEST(Checkpoint, ReplacesAtomicallyAndLeavesNoTemporaries) {
  const std::string dir = TempDir("replace");
  auto session = MakeSession(TinyOptions());
  TrainSteps(*session, 0, 2);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/ckpt").ok());
  TrainSteps(*session, 2, 3);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/ckpt").ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  ASSERT_EQ(names, std::vector<std::string>{"ckpt"});
  for (const char* file : {"config.json", "model.safetensors", "optimizer.safetensors", "tigon_state.json"})
    EXPECT_TRUE(fs::exists(dir + "/ckpt/" + file)) << file;
  // Hugging Face Trainer's trainer_state.json has another schema: a Tigon checkpoint does not claim the name.
  EXPECT_FALSE(fs::exists(dir + "/ckpt/trainer_state.json"));
  auto fresh = MakeSession(TinyOptions());
  ASSERT_TRUE(fresh->LoadCheckpoint(dir + "/ckpt").ok());
  EXPECT_EQ(fresh->Info().step, 5);
  fs::remove_all(dir);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

TEST(Checkpoint, LoadsTheStepFromCheckpointsWrittenBeforeTheStateFileWasRenamed) {
  const std::string dir = TempDir("legacy_state");
  auto session = MakeSession(TinyOptions());
  TrainSteps(*session, 0, 3);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/ckpt").ok());
  // An older checkpoint: the same state under its old name.
  fs::rename(dir + "/ckpt/tigon_state.json", dir + "/ckpt/trainer_state.json");
  auto old = MakeSession(TinyOptions());
  Status status = old->LoadCheckpoint(dir + "/ckpt");
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(old->Info().step, 3);
  // Both present (a folder a Hugging Face tool also wrote into): Tigon's own file is the one read.
  WriteFile(dir + "/ckpt/tigon_state.json", ReadFile(dir + "/ckpt/trainer_state.json"));
  WriteFile(dir + "/ckpt/trainer_state.json", R"({"global_step": 99, "step": 99})");
  auto both = MakeSession(TinyOptions());
  ASSERT_TRUE(both->LoadCheckpoint(dir + "/ckpt").ok());
  EXPECT_EQ(both->Info().step, 3);
  fs::remove_all(dir);
}

TEST(Checkpoint, ASessionFromAModelFolderExportsItsTokenizerAndGenerationConfig) {
  const std::string dir = TempDir("companions");
  auto random = MakeSession(TinyOptions());
  ASSERT_TRUE(random->SaveCheckpoint(dir + "/model").ok());
  EXPECT_FALSE(fs::exists(dir + "/model/tokenizer.json"));  // a random model has no tokenizer to copy
  const std::vector<std::pair<std::string, std::string>> companions = {
      {"generation_config.json", R"({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.6})"},
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"tokenizer_class": "PreTrainedTokenizerFast"})"},
      {"special_tokens_map.json", R"({"bos_token": "<s>"})"},
      {"tokenizer.model", std::string("\x0a\x00sentencepiece\xff", 16)},
      {"vocab.json", R"({"a": 0})"},
      {"merges.txt", "#version: 0.2\na b\n"}};
  for (const auto& [file, content] : companions) WriteFile(dir + "/model/" + file, content);
  WriteFile(dir + "/model/notes.txt", "not a model file");
  SessionOptions from_folder = TinyOptions();
  from_folder.config_json.clear();
  from_folder.model_path = dir + "/model";
  auto session = MakeSession(from_folder);
  ASSERT_TRUE(session);
  // What the folder held when the session was created is exported, even if the folder changes later.
  WriteFile(dir + "/model/tokenizer.json", "changed after the session was created");
  TrainSteps(*session, 0, 1);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/export").ok());
  for (const auto& [file, content] : companions) EXPECT_EQ(ReadFile(dir + "/export/" + file), content) << file;
  EXPECT_FALSE(fs::exists(dir + "/export/notes.txt"));
  // An export is itself a model folder whose exports keep the files.
  from_folder.model_path = dir + "/export";
  auto again = MakeSession(from_folder);
  ASSERT_TRUE(again->SaveCheckpoint(dir + "/export2").ok());
  for (const auto& [file, content] : companions) EXPECT_EQ(ReadFile(dir + "/export2/" + file), content) << file;
  fs::remove_all(dir);
}

TEST(Checkpoint, WeightsLoadAsAHuggingFaceFolder) {
  const std::string dir = TempDir("hf");
  auto session = MakeSession(TinyOptions());
  TrainSteps(*session, 0, 3);
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/ckpt").ok());
  SessionOptions from_folder = TinyOptions();
  from_folder.config_json.clear();
  from_folder.model_path = dir + "/ckpt";
  auto loaded = MakeSession(from_folder);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->Info().step, 0);  // a model folder carries weights only
  auto batch = RandomBatch(2, 16, 77);
  ForwardResult a, b;
  ASSERT_TRUE(session->Forward(batch, &a).ok());
  ASSERT_TRUE(loaded->Forward(batch, &b).ok());
  EXPECT_EQ(a.loss, b.loss);
  fs::remove_all(dir);
}

TEST(Checkpoint, FailedLoadsLeaveTheSessionUnchanged) {
  const std::string dir = TempDir("bad");
  auto session = MakeSession(TinyOptions());
  TrainSteps(*session, 0, 2);
  auto batch = RandomBatch(2, 16, 5);
  ForwardResult before;
  ASSERT_TRUE(session->Forward(batch, &before).ok());

  EXPECT_EQ(session->LoadCheckpoint(dir + "/missing").code(), StatusCode::kNotFound);

  // A checkpoint of a different model.
  auto other_options = TinyOptions();
  other_options.config_json = testing::TinyConfig("llama", 64, 2);
  auto other = MakeSession(other_options);
  ASSERT_TRUE(other->SaveCheckpoint(dir + "/other").ok());
  Status status = session->LoadCheckpoint(dir + "/other");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("different model"), std::string::npos) << status.message();

  // A truncated weights file.
  auto same = MakeSession(TinyOptions());
  ASSERT_TRUE(same->SaveCheckpoint(dir + "/trunc").ok());
  fs::resize_file(dir + "/trunc/model.safetensors", fs::file_size(dir + "/trunc/model.safetensors") / 2);
  status = session->LoadCheckpoint(dir + "/trunc");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();

  EXPECT_EQ(session->Info().step, 2);
  ForwardResult after;
  ASSERT_TRUE(session->Forward(batch, &after).ok());
  EXPECT_EQ(before.loss, after.loss);
  fs::remove_all(dir);
}

TEST(Checkpoint, SavingWithPendingGradientsIsRefused) {
  const std::string dir = TempDir("pending");
  auto session = MakeSession(TinyOptions());
  ASSERT_TRUE(session->ForwardBackward(RandomBatch(1, 8, 1), nullptr).ok());
  Status status = session->SaveCheckpoint(dir + "/ckpt");
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_FALSE(fs::exists(dir + "/ckpt"));
  fs::remove_all(dir);
}

// The save goes through the parent's descriptor: the path swapped for a link to elsewhere after the
// folder was opened, and links planted at the temporary names, change nothing about where files land.
TEST(Checkpoint, SavesGoThroughTheHeldFolderWhateverLinksAreSwappedIn) {
  const std::string dir = TempDir("held");
  fs::create_directories(dir + "/run");
  fs::create_directories(dir + "/elsewhere");
  auto session = MakeSession(TinyOptions());
  const int parent = ::open((dir + "/run").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(parent, 0);
  fs::rename(dir + "/run", dir + "/moved");
  fs::create_directory_symlink(dir + "/elsewhere", dir + "/run");
  for (int n = 0; n < 8; ++n) {
    fs::create_directory_symlink(dir + "/elsewhere",
                                 dir + "/moved/ckpt.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n));
  }
  Status status = session->SaveCheckpointAt(parent, "ckpt", "'ckpt'");
  ASSERT_TRUE(status.ok()) << status.ToString();
  ::close(parent);
  EXPECT_TRUE(fs::is_regular_file(dir + "/moved/ckpt/model.safetensors"));
  EXPECT_TRUE(fs::is_empty(dir + "/elsewhere"));
  // A link at the final name is replaced by the checkpoint, never written through.
  fs::create_directory_symlink(dir + "/elsewhere", dir + "/moved/linked");
  ASSERT_TRUE(session->SaveCheckpoint(dir + "/moved/linked").ok());
  EXPECT_FALSE(fs::is_symlink(dir + "/moved/linked"));
  EXPECT_TRUE(fs::is_empty(dir + "/elsewhere"));
  // Loading does not follow a link inside the checkpoint folder.
  fs::remove(dir + "/moved/ckpt/model.safetensors");
  fs::create_symlink(dir + "/moved/linked/model.safetensors", dir + "/moved/ckpt/model.safetensors");
  status = session->LoadCheckpoint(dir + "/moved/ckpt");
  EXPECT_FALSE(status.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tigon
