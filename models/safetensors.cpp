// A safetensors reader and writer. The header is untrusted input: every length, offset and shape is
// checked before anything is allocated or read, so a corrupt file yields a ModelError, never a crash or
// a huge allocation.
#include "models/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <system_error>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/bounded_json.h"
#include "models/model.h"

namespace tigon::models {
namespace {

// The reference implementation refuses headers above 100 MB; so do we (a bigger one is corrupt).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  const char* name;
  torch::Dtype dtype;
  int64_t bytes;
};

const std::vector<DtypeInfo>& Dtypes() {
  static const std::vector<DtypeInfo> kDtypes = {
      {"F64", torch::kFloat64, 8},   {"F32", torch::kFloat32, 4}, {"F16", torch::kFloat16, 2},
      {"BF16", torch::kBFloat16, 2}, {"I64", torch::kInt64, 8},   {"I32", torch::kInt32, 4},
      {"I16", torch::kInt16, 2},     {"I8", torch::kInt8, 1},     {"U8", torch::kUInt8, 1},
      {"BOOL", torch::kBool, 1},
  };
  return kDtypes;
}

const DtypeInfo* FindDtype(const std::string& name) {
  for (const auto& info : Dtypes()) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

const DtypeInfo& FindDtype(torch::Dtype dtype, const std::string& path, const std::string& tensor) {
  for (const auto& info : Dtypes()) {
    if (info.dtype == dtype) return info;
  }
  throw ModelError(path + ": tensor '" + tensor + "' has dtype " + std::string(c10::toString(dtype)) +
                   ", which safetensors cannot store here");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by begin offset
  uint64_t data_start;         // file offset of the data section
};

uint64_t ReadU64(const nlohmann::json& value, const std::string& what, const std::string& context) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0)) {
    throw ModelError(context + ": " + what + " must be a non-negative integer, got " + value.dump());
  }
  return value.get<uint64_t>();
}

// Where the bytes come from: a file or a buffer in memory. Read returns false when it could not read
// all `n` bytes at `offset`.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t Size() = 0;
  virtual bool Read(uint64_t offset, void* out, uint64_t n) = 0;
};

class FileSource final : public ByteSource {
 public:
  FileSource(const std::string& path, std::ifstream& file) : path_(path), file_(file) {}
  uint64_t Size() override {
    file_.seekg(0, std::ios::end);
    const std::streamoff size = file_.tellg();
    if (size < 0) throw ModelError(path_ + ": cannot determine the file size");
    return static_cast<uint64_t>(size);
  }
  bool Read(uint64_t offset, void* out, uint64_t n) override {
    file_.seekg(static_cast<std::streamoff>(offset));
    file_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    return static_cast<bool>(file_);
  }

 private:
  const std::string& path_;
  std::ifstream& file_;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(const void* data, size_t size) : data_(static_cast<const char*>(data)), size_(size) {}
  uint64_t Size() override { return size_; }
  bool Read(uint64_t offset, void* out, uint64_t n) override {
    if (offset > size_ || n > size_ - offset) return false;
    if (n > 0) std::memcpy(out, data_ + offset, n);
    return true;
  }

 private:
  const char* data_;
  uint64_t size_;
};

Header ParseHeader(const std::string& path, ByteSource& source) {
  const uint64_t file_size = source.Size();
  if (file_size < 8) {
    throw ModelError(path + ": truncated file (" + std::to_string(file_size) +
                     " bytes, less than the 8-byte header length)");
  }
  unsigned char length_bytes[8];
  if (!source.Read(0, length_bytes, 8)) throw ModelError(path + ": could not read the 8-byte header length");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];  // little-endian
  if (header_length > file_size - 8) {
    throw ModelError(path + ": header length " + std::to_string(header_length) + " runs past the end of the file (" +
                     std::to_string(file_size) + " bytes): truncated or not a safetensors file");
  }
  if (header_length > kMaxHeaderBytes) {
    throw ModelError(path + ": header length " + std::to_string(header_length) + " exceeds the 100 MB limit");
  }
  std::string text(header_length, '\0');
  if (!source.Read(8, text.data(), header_length)) {
    throw ModelError(path + ": could not read the " + std::to_string(header_length) + "-byte header");
  }

  nlohmann::json json;
  try {
    json = ParseBoundedJson(text);
  } catch (const JsonInputError& e) {  // syntax, depth, and out_of_range for numbers like 1e999
    throw ModelError(path + ": malformed header JSON: " + e.what());
  }
  if (!json.is_object()) {
    throw ModelError(path + ": header must be a JSON object, got " + std::string(json.type_name()));
  }

  Header header;
  header.data_start = 8 + header_length;
  const uint64_t data_size = file_size - header.data_start;
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") continue;
    const std::string context = path + ": tensor '" + name + "'";
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      throw ModelError(context + ": entry must be an object with dtype, shape and data_offsets");
    }
    Entry entry;
    entry.name = name;
    if (!value["dtype"].is_string()) throw ModelError(context + ": dtype must be a string");
    const std::string dtype_name = value["dtype"].get<std::string>();
    entry.dtype = FindDtype(dtype_name);
    if (entry.dtype == nullptr) {
      throw ModelError(context + ": unknown dtype '" + dtype_name +
                       "' (supported: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
    }
    const auto& shape = value["shape"];
    if (!shape.is_array()) throw ModelError(context + ": shape must be an array");
    uint64_t numel = 1;
    for (const auto& dim_json : shape) {
      const uint64_t dim = ReadU64(dim_json, "shape dimension", context);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, dim, &numel)) {
        throw ModelError(context + ": shape " + shape.dump() + " overflows 64-bit element counts");
      }
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(entry.dtype->bytes), &nbytes)) {
      throw ModelError(context + ": shape " + shape.dump() + " overflows 64-bit byte counts");
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      throw ModelError(context + ": data_offsets must be [begin, end], got " + offsets.dump());
    }
    entry.begin = ReadU64(offsets[0], "data_offsets[0]", context);
    entry.end = ReadU64(offsets[1], "data_offsets[1]", context);
    if (entry.end < entry.begin) {
      throw ModelError(context + ": data_offsets " + offsets.dump() + " end before they begin");
    }
    if (entry.end - entry.begin != nbytes) {
      throw ModelError(context + ": data_offsets " + offsets.dump() + " span " +
                       std::to_string(entry.end - entry.begin) + " bytes but dtype " + dtype_name + " with shape " +
                       ShapeString(entry.shape) + " needs " + std::to_string(nbytes));
    }
    if (entry.end > data_size) {
      throw ModelError(context + ": data_offsets " + offsets.dump() + " out of range: the data section has " +
                       std::to_string(data_size) + " bytes (truncated file?)");
    }
    header.entries.push_back(std::move(entry));
  }
  std::sort(header.entries.begin(), header.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  const Entry* previous = nullptr;
  for (const auto& entry : header.entries) {
    if (entry.begin == entry.end) continue;  // empty tensors occupy no bytes
    if (previous != nullptr && entry.begin < previous->end) {
      throw ModelError(path + ": tensors '" + previous->name + "' and '" + entry.name +
                       "' have overlapping data_offsets");
    }
    previous = &entry;
  }
  return header;
}

std::ifstream OpenForRead(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw ModelError(path + ": cannot open for reading: " + std::strerror(errno));
  }
  return file;
}

// Every tensor, or only those in `names` when given.
std::map<std::string, torch::Tensor> ReadTensors(const std::string& path, ByteSource& source,
                                                 const std::set<std::string>* names = nullptr) {
  const Header header = ParseHeader(path, source);
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : header.entries) {
    if (names != nullptr && names->count(entry.name) == 0) continue;
    torch::Tensor tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype->dtype));
    const uint64_t nbytes = entry.end - entry.begin;
    if (nbytes > 0 && !source.Read(header.data_start + entry.begin, tensor.data_ptr(), nbytes)) {
      throw ModelError(path + ": tensor '" + entry.name + "': could not read " + std::to_string(nbytes) +
                       " bytes (truncated file?)");
    }
    out.emplace(entry.name, std::move(tensor));
  }
  return out;
}

}  // namespace

std::map<std::string, std::pair<std::string, std::vector<int64_t>>> ReadSafetensorsHeader(const std::string& path) {
  std::ifstream file = OpenForRead(path);
  FileSource source(path, file);
  const Header header = ParseHeader(path, source);
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& entry : header.entries) out[entry.name] = {entry.dtype->name, entry.shape};
  return out;
}

std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path) {
  std::ifstream file = OpenForRead(path);
  FileSource source(path, file);
  return ReadTensors(path, source);
}

std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path, const std::set<std::string>& names) {
  std::ifstream file = OpenForRead(path);
  FileSource source(path, file);
  return ReadTensors(path, source, &names);
}

std::map<std::string, torch::Tensor> ReadSafetensorsFromMemory(const void* data, size_t size, const std::string& name) {
  MemorySource source(data, size);
  return ReadTensors(name, source);
}

void WriteSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ModelError(path + ": cannot open for writing: " + std::strerror(errno));
  try {
    WriteSafetensors(fd, path, tensors, metadata);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw std::system_error(errno, std::generic_category(), path + ": close failed");
}

void WriteSafetensors(int fd, const std::string& name, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  data.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor_name == "__metadata__") throw ModelError(name + ": '__metadata__' is not a valid tensor name");
    if (!tensor.defined()) throw ModelError(name + ": tensor '" + tensor_name + "' is undefined");
    const DtypeInfo& info = FindDtype(tensor.scalar_type(), name, tensor_name);
    torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(cpu.numel()) * info.bytes;
    header[tensor_name] = {{"dtype", info.name}, {"shape", cpu.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(cpu));
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  auto write_all = [&](const void* bytes, size_t size) {
    const char* p = static_cast<const char*>(bytes);
    while (size > 0) {
      const ssize_t n = ::write(fd, p, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::system_error(errno, std::generic_category(), name + ": write failed");
      p += n;
      size -= static_cast<size_t>(n);
    }
  };
  unsigned char length_bytes[8];
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(length >> (8 * i));
  write_all(length_bytes, 8);
  write_all(text.data(), text.size());
  for (const auto& cpu : data) {
    const size_t nbytes = static_cast<size_t>(cpu.numel()) * cpu.element_size();
    if (nbytes > 0) write_all(cpu.data_ptr(), nbytes);
  }
  if (::fsync(fd) != 0) throw std::system_error(errno, std::generic_category(), name + ": fsync failed");
}

}  // namespace tigon::models
