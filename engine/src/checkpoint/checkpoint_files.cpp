#include "checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>

#include "checkpoint/atomic_dir.h"
#include "common/bounded_json.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace tigon::engine {
namespace {

// A file of the folder mapped read-only for as long as it lives.
class MappedFile {
 public:
  MappedFile(int dir_fd, const std::string& file) : fd_(OpenFileAt(dir_fd, file)) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw std::system_error(errno, std::generic_category(), "cannot inspect " + file);
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return;
    data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_.get(), 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      throw std::system_error(errno, std::generic_category(), "cannot map " + file);
    }
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(data_); }
  size_t size() const { return size_; }

 private:
  UniqueFd fd_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void WriteCheckpoint(int parent_fd, const std::string& name, const CheckpointContents& contents) {
  TempDir temp = MakeTempDir(parent_fd, name);
  try {
    WriteFileAt(temp.fd.get(), "config.json", contents.config_json);
    {
      UniqueFd weights = CreateFileAt(temp.fd.get(), "model.safetensors");
      models::WriteSafetensors(weights.get(), "model.safetensors", contents.model, {{"format", "pt"}});
    }
    {
      UniqueFd optimizer = CreateFileAt(temp.fd.get(), "optimizer.safetensors");
      models::WriteSafetensors(optimizer.get(), "optimizer.safetensors", contents.optimizer,
                               contents.optimizer_metadata);
    }
    WriteFileAt(temp.fd.get(), kTigonStateFile, contents.tigon_state);
    for (const auto& [file, content] : contents.companion_files) WriteFileAt(temp.fd.get(), file, content);
  } catch (...) {
    RemoveTreeAt(parent_fd, temp.name);
    throw;
  }
  PublishDirectory(parent_fd, temp, name);
}

std::map<std::string, std::string> ReadCompanionFiles(const std::string& model_folder) {
  std::map<std::string, std::string> out;
  for (const char* file : kModelFolderCompanionFiles) {
    const std::string path = model_folder + "/" + file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (st.st_size > kMaxCompanionFileBytes) {
      throw models::ModelError(std::string(file) + " of the model folder is larger than " +
                               std::to_string(kMaxCompanionFileBytes >> 20) + " MiB");
    }
    std::ifstream in(path, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw models::ModelError("cannot read " + std::string(file) + " of the model folder");
    out.emplace(file, std::move(content));
  }
  return out;
}

nlohmann::json ReadJsonAt(int dir_fd, const std::string& file, const std::string& label) {
  MappedFile mapped(dir_fd, file);
  try {
    return ParseBoundedJson(std::string_view(mapped.data(), mapped.size()));
  } catch (const JsonInputError& e) {
    throw models::ModelError("malformed JSON in " + file + " of checkpoint " + label + ": " + e.what());
  }
}

std::map<std::string, torch::Tensor> ReadSafetensorsAt(int dir_fd, const std::string& file, const std::string& label) {
  MappedFile mapped(dir_fd, file);
  return models::ReadSafetensorsFromMemory(mapped.data(), mapped.size(), file + " of checkpoint " + label);
}

std::map<std::string, torch::Tensor> ReadModelTensorsAt(int dir_fd, const std::string& label) {
  if (RegularFileAt(dir_fd, "model.safetensors")) return ReadSafetensorsAt(dir_fd, "model.safetensors", label);
  if (!RegularFileAt(dir_fd, "model.safetensors.index.json")) {
    throw models::ModelError("no model.safetensors or model.safetensors.index.json in checkpoint " + label);
  }
  const nlohmann::json index = ReadJsonAt(dir_fd, "model.safetensors.index.json", label);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw models::ModelError("model.safetensors.index.json of checkpoint " + label + " has no weight_map object");
  }
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      throw models::ModelError("model.safetensors.index.json of checkpoint " + label + ": weight_map entry '" + name +
                               "' must name a shard file");
    }
    files.insert(file.get<std::string>());
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& file : files) {
    for (auto& [name, tensor] : ReadSafetensorsAt(dir_fd, file, label)) out[name] = tensor;
  }
  return out;
}

}  // namespace tigon::engine

namespace tigon {

Status Session::SaveCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) return Status(StatusCode::kInvalidArgument, "checkpoint path is empty");
  fs::path path = fs::absolute(fs::path(dir)).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return Status(engine::StatusCodeForErrno(ec.value()), "cannot create " + path.parent_path().string() +
                                                                    ": " + ec.message());
  engine::UniqueFd parent(::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent.get() < 0) {
    return Status(engine::StatusCodeForErrno(errno), "cannot open " + path.parent_path().string() + ": " +
                                                         std::strerror(errno));
  }
  return SaveCheckpointAt(parent.get(), path.filename().string(), dir);
}

Status Session::LoadCheckpoint(const std::string& dir) {
  engine::UniqueFd folder(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (folder.get() < 0) return Status(StatusCode::kNotFound, "no checkpoint directory at " + dir);
  return LoadCheckpointAt(folder.get(), dir);
}

}  // namespace tigon
