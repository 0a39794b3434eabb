// The limiting CPU allocator behind tigon/cpu_memory_limit.h. It takes raw blocks from the allocator it
// replaces (torch's default CPU allocator) and hands out DataPtrs whose context is the data pointer, as
// the default allocator does, so code that frees through raw_deleter() or checks for "simple" data
// pointers keeps working. Block sizes live in a map (one lookup per allocation and free; CPU tensors are
// not allocated at a rate where that matters).
#include "tigon/cpu_memory_limit.h"

#include "runtime/host_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace tigon {
namespace {

constexpr const char* kEnvironmentVariable = "TIGON_CPU_MEMORY_LIMIT_BYTES";

class LimitingCpuAllocator final : public c10::Allocator {
 public:
  explicit LimitingCpuAllocator(c10::Allocator* inner) : inner_(inner), inner_free_(inner->raw_deleter()) {}

  // LibTorch 1.13 declares allocate() const, 2.x non-const: defining both overrides whichever exists.
  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  // Pure virtual in LibTorch 2.x (used by clone()); a plain member in 1.13.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }

  void set_limit(int64_t bytes) { limit_.store(bytes); }
  CpuMemoryUsage usage() const {
    CpuMemoryUsage out;
    out.limit_bytes = limit_.load();
    out.in_use_bytes = in_use_.load();
    out.peak_bytes = peak_.load();
    out.refused = refused_.load();
    out.installed = true;
    return out;
  }
  void reset_peak() { peak_.store(in_use_.load()); }

 private:
  c10::DataPtr Allocate(size_t n) const {
    Reserve(n);
    void* data = nullptr;
    try {
      data = inner_->raw_allocate(n);
    } catch (...) {
      in_use_.fetch_sub(static_cast<int64_t>(n));
      throw;
    }
    if (data == nullptr) {  // zero bytes
      in_use_.fetch_sub(static_cast<int64_t>(n));
      return c10::DataPtr(nullptr, nullptr, &Free, c10::Device(c10::DeviceType::CPU));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = n;
    }
    return c10::DataPtr(data, data, &Free, c10::Device(c10::DeviceType::CPU));
  }

  // Counts `n` bytes as in use, or throws c10::OutOfMemoryError when that would pass the limit.
  void Reserve(size_t n) const {
    const int64_t bytes = n > static_cast<size_t>(std::numeric_limits<int64_t>::max())
                              ? std::numeric_limits<int64_t>::max()
                              : static_cast<int64_t>(n);
    int64_t current = in_use_.load();
    while (true) {
      const int64_t limit = limit_.load();
      if (limit > 0 && (bytes > limit || current > limit - bytes)) {
        refused_.fetch_add(1);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", bytes, " bytes with ",
                         current, " bytes of CPU tensors in use; the CPU memory limit is ", limit, " bytes (",
                         kEnvironmentVariable, ")");
      }
      if (in_use_.compare_exchange_weak(current, current + bytes)) break;
    }
    int64_t peak = peak_.load();
    while (current + bytes > peak && !peak_.compare_exchange_weak(peak, current + bytes)) {
    }
  }

  static void Free(void* data);

  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_free_;
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable std::atomic<int64_t> in_use_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> limit_{0};
};

std::mutex g_install_mu;
// Never destroyed: tensors freed during process exit still call its deleter.
std::atomic<LimitingCpuAllocator*> g_allocator{nullptr};

LimitingCpuAllocator* Installed() { return g_allocator.load(); }

void LimitingCpuAllocator::Free(void* data) {
  LimitingCpuAllocator* self = Installed();
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    auto it = self->sizes_.find(data);
    if (it != self->sizes_.end()) {
      n = it->second;
      self->sizes_.erase(it);
    }
  }
  self->in_use_.fetch_sub(static_cast<int64_t>(n));
  self->inner_free_(data);
}

LimitingCpuAllocator* Install() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (LimitingCpuAllocator* existing = g_allocator.load()) return existing;
  c10::Allocator* inner = c10::GetCPUAllocator();
  if (inner->raw_deleter() == nullptr) {
    throw std::runtime_error("the CPU memory limit needs a CPU allocator with raw allocations");
  }
  auto* allocator = new LimitingCpuAllocator(inner);
  g_allocator.store(allocator);
  // The highest priority, so that no later registration of a default allocator replaces it.
  c10::SetCPUAllocator(allocator, std::numeric_limits<uint8_t>::max());
  if (c10::GetCPUAllocator() != allocator) {
    throw std::runtime_error("torch did not accept the limiting CPU allocator");
  }
  return allocator;
}

// TIGON_CPU_MEMORY_LIMIT_BYTES, read when the engine library loads (after c10, whose default allocator
// it wraps, has registered it). Unset, the cap is kDefaultCpuMemoryShare of the machine: a session whose
// tensors would take the rest gets RESOURCE_EXHAUSTED instead of the kernel's OOM killer ending the
// process and every session in it.
[[maybe_unused]] const bool g_from_environment = [] {
  const char* text = std::getenv(kEnvironmentVariable);
  if (text == nullptr || *text == '\0') {
    const int64_t machine = engine::MachineMemoryBytes();
    if (machine <= 0) return false;
    try {
      SetCpuMemoryLimit(static_cast<int64_t>(static_cast<double>(machine) * kDefaultCpuMemoryShare));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tigon: cannot apply the default CPU memory limit: %s\n", e.what());
    }
    return false;
  }
  char* end = nullptr;
  errno = 0;
  const long long bytes = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || bytes < 0) {
    std::fprintf(stderr, "tigon: ignoring %s=%s: not a byte count\n", kEnvironmentVariable, text);
    return false;
  }
  try {
    SetCpuMemoryLimit(bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tigon: cannot apply %s: %s\n", kEnvironmentVariable, e.what());
    return false;
  }
  std::fprintf(stderr, "tigon: CPU tensor memory limited to %lld bytes (%s)\n", bytes, kEnvironmentVariable);
  return true;
}();

}  // namespace

void SetCpuMemoryLimit(int64_t bytes) {
  if (bytes < 0) throw std::invalid_argument("CPU memory limit must be >= 0, got " + std::to_string(bytes));
  Install()->set_limit(bytes);
}

CpuMemoryUsage GetCpuMemoryUsage() {
  LimitingCpuAllocator* allocator = Installed();
  return allocator != nullptr ? allocator->usage() : CpuMemoryUsage{};
}

void ResetCpuMemoryPeak() {
  if (LimitingCpuAllocator* allocator = Installed()) allocator->reset_peak();
}

}  // namespace tigon
