// Helpers shared by the model tests: fixture paths, temporary folders, relative error.
#pragma once

#include <ftw.h>
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/model.h"
#include "models/safetensors.h"

namespace tigon::models::testing {

// Every registered family (models/families/); each has a Hugging Face fixture under tests/fixtures/<name>.
inline const std::vector<std::string>& Families() {
  static const std::vector<std::string> kFamilies = SupportedFamilies();
  return kFamilies;
}

inline std::string FixtureDir(const std::string& family) {
  return std::string(TIGON_SOURCE_DIR) + "/tests/fixtures/" + family;
}

// max|a - b| / max|b| over the whole tensor, in float64.
inline double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const auto a = actual.detach().to(torch::kCPU, torch::kFloat64);
  const auto b = expected.detach().to(torch::kCPU, torch::kFloat64);
  EXPECT_EQ(a.sizes(), b.sizes());
  const double scale = b.abs().max().item<double>();
  const double diff = (a - b).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// A fresh folder under the system temp dir, removed when the object goes away.
// POSIX nftw rather than std::filesystem::remove_all: LibTorch 2.11's libtorch.so exports a copy of
// remove_all that crashes (a call through a null pointer) when it wins symbol resolution, as it does in a
// test binary that links torch directly.
inline int RemoveTreeEntry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }
inline void RemoveTree(const std::string& path) { ::nftw(path.c_str(), RemoveTreeEntry, 16, FTW_DEPTH | FTW_PHYS); }

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tigon_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    RemoveTree(path_.string());
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    RemoveTree(path_.string());
  }
  std::string path() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

inline nlohmann::json ReadConfig(const std::string& family) {
  return nlohmann::json::parse(ReadText(FixtureDir(family) + "/config.json"));
}

// Copies a fixture's config.json and model.safetensors into `dir`.
inline void CopyFixture(const std::string& family, const TempDir& dir) {
  for (const char* name : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(FixtureDir(family) + "/" + name, dir / name,
                               std::filesystem::copy_options::overwrite_existing);
  }
}

// Runs `body`, which must throw ModelError; returns its message ("" and a test failure otherwise).
template <typename Body>
std::string ModelErrorMessage(Body body) {
  try {
    body();
  } catch (const ModelError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ModelError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ModelError, nothing was thrown";
  return "";
}

}  // namespace tigon::models::testing
