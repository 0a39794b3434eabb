// Fuzzes the safetensors reader on whole files in memory: the 8-byte length, the JSON header (dtypes,
// shapes, data_offsets) and the data section. Contract (models/safetensors.h): any input either loads
// or throws ModelError; a loaded tensor's bytes lie inside the input, so nothing allocated can be larger
// than the file.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_check.h"
#include "models/model.h"
#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, torch::Tensor> tensors;
  try {
    tensors = tigon::models::ReadSafetensorsFromMemory(data, size, "fuzz.safetensors");
  } catch (const tigon::models::ModelError&) {
    return 0;  // refused with a message: the expected outcome for most inputs
  }
  uint64_t total = 0;
  for (const auto& [name, tensor] : tensors) {
    FUZZ_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(), "tensor '%s' is not a contiguous CPU tensor",
               name.c_str());
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    FUZZ_CHECK(nbytes <= size, "tensor '%s' has %llu bytes, more than the %zu-byte input", name.c_str(),
               static_cast<unsigned long long>(nbytes), size);
    total += nbytes;
  }
  // Overlapping tensors are refused, so together they fit in the input too.
  FUZZ_CHECK(total <= size, "tensors total %llu bytes, more than the %zu-byte input",
             static_cast<unsigned long long>(total), size);
  return 0;
}
