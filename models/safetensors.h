// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw data.
#pragma once

#include <torch/types.h>

#include <map>
#include <set>
#include <string>

namespace tigon::models {

// Reads every tensor of a file (CPU tensors). Validates the header, dtypes, shapes against offsets,
// offsets against the file size, overlaps and overflow; throws ModelError naming the file and problem.
std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path);

// Only the tensors named in `names` (those the file lacks are left out): the others are neither
// allocated nor read, so a file with unused tensors costs only what the caller needs.
std::map<std::string, torch::Tensor> ReadSafetensors(const std::string& path, const std::set<std::string>& names);

// The same for a whole file's bytes in memory; `name` stands in for the path in error messages.
std::map<std::string, torch::Tensor> ReadSafetensorsFromMemory(const void* data, size_t size, const std::string& name);

// Only the header: name -> (dtype string, shape). Throws ModelError like ReadSafetensors.
std::map<std::string, std::pair<std::string, std::vector<int64_t>>> ReadSafetensorsHeader(const std::string& path);

// Writes `tensors` (any device; F32/BF16/F16/I32/I64) to `path` and fsyncs it. Not atomic by itself:
// callers write to a temporary name and rename.
void WriteSafetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The same into a file already open for writing (`fd`, left open); `name` stands in for the path in
// errors. I/O failures throw std::system_error carrying errno (ENOSPC for a full disk).
void WriteSafetensors(int fd, const std::string& name, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace tigon::models
