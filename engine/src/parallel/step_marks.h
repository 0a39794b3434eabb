// Where one replica's forward_backward stands on its device, for the data-parallel timings.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <array>

#include "tigon/data_parallel.h"

#ifdef TIGON_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace tigon::engine {

// The current stream of `device` (a cudaStream_t; null for the CPU).
inline void* CurrentStream(const torch::Device& device) {
#ifdef TIGON_WITH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
#endif
  return nullptr;
}

// Points of one replica's forward_backward on its device: CUDA events on the compute stream (device time,
// ReplicaTimings); nothing for CPU replicas, whose timings come from the host clock.
class StepMarks {
 public:
  enum Mark { kStart = 0, kFirstGradient = 1, kBackwardEnd = 2 };

  explicit StepMarks(torch::Device device) : device_(device) {}
  ~StepMarks() {
#ifdef TIGON_WITH_CUDA
    for (auto& event : events_)
      if (event != nullptr) cudaEventDestroy(event);
#endif
  }
  StepMarks(const StepMarks&) = delete;
  StepMarks& operator=(const StepMarks&) = delete;

  // Forgets the last step's marks; creates the events on the replica's device the first time.
  void Clear() {
    recorded_ = {false, false, false};
#ifdef TIGON_WITH_CUDA
    if (!device_.is_cuda() || events_[0] != nullptr) return;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    if (cudaSetDevice(device_.index()) == cudaSuccess) {
      for (auto& event : events_) {
        if (cudaEventCreate(&event) != cudaSuccess) event = nullptr;
      }
    }
    cudaSetDevice(previous);
#endif
  }

  // On any thread: marks the point the replica's compute stream has reached.
  void Record(Mark mark) {
#ifdef TIGON_WITH_CUDA
    if (!device_.is_cuda() || events_[mark] == nullptr) return;
    auto stream = static_cast<cudaStream_t>(CurrentStream(device_));
    recorded_[mark] = cudaEventRecord(events_[mark], stream) == cudaSuccess;
#else
    (void)mark;
#endif
  }

  // Device milliseconds between two recorded marks (waits for `to`); negative when not known.
  double Ms(Mark from, Mark to) {
#ifdef TIGON_WITH_CUDA
    if (!recorded_[from] || !recorded_[to]) return -1.0;
    if (cudaEventSynchronize(events_[to]) != cudaSuccess) return -1.0;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, events_[from], events_[to]) != cudaSuccess) return -1.0;
    return ms;
#else
    (void)from;
    (void)to;
    return -1.0;
#endif
  }

 private:
  torch::Device device_;
  std::array<bool, 3> recorded_{false, false, false};
#ifdef TIGON_WITH_CUDA
  std::array<cudaEvent_t, 3> events_{nullptr, nullptr, nullptr};
#endif
};

// Forward and backward of one replica: device time between the CUDA marks where there are any, else host
// time. A replica whose rows produced no gradient has no first-gradient mark: all of it is forward.
inline void FillForwardBackwardTimings(StepMarks& marks, double first_gradient_s, double backward_end_s,
                                       ReplicaTimings* out) {
  const bool had_gradient = first_gradient_s >= 0;
  out->host_forward_ms = 1e3 * (had_gradient ? first_gradient_s : backward_end_s);
  const double device_forward =
      marks.Ms(StepMarks::kStart, had_gradient ? StepMarks::kFirstGradient : StepMarks::kBackwardEnd);
  if (device_forward >= 0) {
    out->forward_ms = device_forward;
    out->backward_ms = had_gradient ? std::max(0.0, marks.Ms(StepMarks::kFirstGradient, StepMarks::kBackwardEnd)) : 0.0;
  } else {
    out->forward_ms = out->host_forward_ms;
    out->backward_ms = had_gradient ? 1e3 * (backward_end_s - first_gradient_s) : 0.0;
  }
}

}  // namespace tigon::engine
