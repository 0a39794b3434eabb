// StartTrace / StopTrace (tigon/data_parallel.h): LibTorch's Kineto profiler around engine calls, for
// benchmarks (tigon-data-parallel-bench --profile). The profiler's CPU side is thread-local; the engine
// carries the caller's thread-local state to its replica threads (and autograd to its device threads), so
// their operators are recorded too. CUDA kernels of every device come from CUPTI.
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <mutex>
#include <set>

#include "tigon/data_parallel.h"

namespace tigon {
namespace {

std::mutex& TraceMutex() {
  static std::mutex mutex;
  return mutex;
}
bool g_tracing = false;

std::string Message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

}  // namespace

Status StartTrace() {
  std::lock_guard<std::mutex> lock(TraceMutex());
  if (g_tracing) return Status(StatusCode::kFailedPrecondition, "a trace is already running");
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  try {
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
#ifdef TIGON_WITH_CUDA
    activities.insert(impl::ActivityType::CUDA);
#endif
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    return Status(StatusCode::kFailedPrecondition, "this LibTorch cannot trace with Kineto: " + Message(e));
  }
  g_tracing = true;
  return Status::Ok();
}

Status StopTrace(const std::string& chrome_trace_path) {
  std::lock_guard<std::mutex> lock(TraceMutex());
  if (!g_tracing) return Status(StatusCode::kFailedPrecondition, "no trace is running (call StartTrace first)");
  g_tracing = false;
  namespace prof = torch::autograd::profiler;
  try {
    auto result = prof::disableProfiler();
    if (!result) return Status(StatusCode::kFailedPrecondition, "the profiler returned no trace");
    result->save(chrome_trace_path);
  } catch (const std::exception& e) {
    return Status(StatusCode::kFailedPrecondition,
                  "writing the trace to " + chrome_trace_path + " failed: " + Message(e));
  }
  return Status::Ok();
}

}  // namespace tigon
