// The NCCL communicator group: one non-blocking NCCL communicator per CUDA device of this process, created
// together (ncclCommInitRankConfig inside one group call), each summing on its own CUDA stream after the
// compute stream's work that produced the gradients. Non-blocking communicators let a waiting rank give up:
// Finish polls for completion, and on the group's abort flag, an NCCL error or the timeout it aborts its
// communicator (ncclCommAbort ends its kernels) instead of hanging. Reset builds fresh communicators.
//
// No torch: this file compiles against the CUDA toolkit and nccl.h alone (CI builds it that way, see
// engine/CMakeLists.txt). Without TIGON_WITH_NCCL only the "not available" entry points are built.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/communicator.h"

#ifdef TIGON_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace tigon::engine {

#ifndef TIGON_WITH_NCCL

bool NcclAvailable() { return false; }

Status MakeNcclCommunicatorGroup(const std::vector<int>& /*devices*/, double /*timeout_seconds*/,
                                 std::unique_ptr<CommunicatorGroup>* /*group*/) {
  return Status(StatusCode::kInvalidArgument, "this build has no NCCL: sessions over several CUDA devices need it");
}

Status MakeNcclWorldGroup(int /*device*/, int /*rank*/, int /*world_size*/, const std::string& /*unique_id*/,
                          double /*timeout_seconds*/, std::unique_ptr<CommunicatorGroup>* /*group*/) {
  return Status(StatusCode::kInvalidArgument, "this build has no NCCL: ranks in several processes need it");
}

Status NewNcclUniqueId(std::string* /*unique_id*/) {
  return Status(StatusCode::kInvalidArgument, "this build has no NCCL: ranks in several processes need it");
}

#else  // TIGON_WITH_NCCL

namespace {

using Clock = std::chrono::steady_clock;

std::string CudaError(const char* what, cudaError_t error) {
  return std::string(what) + ": " + cudaGetErrorString(error);
}

std::string NcclError(const char* what, ncclResult_t result) {
  return std::string(what) + ": " + ncclGetErrorString(result);
}

// Makes `device` current and gives the calling thread its previous device back at the end of the scope:
// communicators are called from threads that are not theirs (the session's caller at creation, replica
// and autograd threads during a step), and those threads' later work must stay on their own device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    error_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

class NcclGroup;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclGroup* group, int rank, int device) : group_(group), rank_(rank), device_(device) {}
  ~NcclCommunicator() override { Release(); }

  int rank() const override { return rank_; }
  int size() const override { return world_size_; }
  int device() const { return device_; }

  // Called by the group, all ranks together (inside ncclGroupStart/End).
  ncclResult_t StartInit(int size, const ncclUniqueId& id) {
    world_size_ = size;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return ncclCommInitRankConfig(&comm_, size, id, rank_, &config);
  }
  ncclComm_t comm() const { return comm_; }

  Status CreateStream() {
    if (stream_ != nullptr) return Status::Ok();
    DeviceScope scope(device_);
    cudaError_t error = scope.error();
    if (error == cudaSuccess) error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (error == cudaSuccess) error = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
    if (error == cudaSuccess) error = cudaEventCreate(&backward_end_);
    if (error == cudaSuccess) error = cudaEventCreate(&done_);
    if (error != cudaSuccess) return Status(StatusCode::kInternal, CudaError("creating the NCCL stream", error));
    return Status::Ok();
  }

  // Ends this rank's collectives without waiting for the others; the communicator is gone afterwards.
  void AbortComm() {
    if (comm_ != nullptr) {
      DeviceScope scope(device_);
      ncclCommAbort(comm_);
      comm_ = nullptr;
      if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // its kernels have exited
    }
  }

  void Release() {
    AbortComm();
    for (auto& pair : bucket_events_) {
      cudaEventDestroy(pair.first);
      cudaEventDestroy(pair.second);
    }
    bucket_events_.clear();
    if (values_) cudaFree(values_);
    values_ = nullptr;
    if (host_values_) cudaFreeHost(host_values_);
    host_values_ = nullptr;
    if (values_done_) cudaEventDestroy(values_done_);
    values_done_ = nullptr;
    if (ready_) cudaEventDestroy(ready_);
    if (backward_end_) cudaEventDestroy(backward_end_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
    ready_ = backward_end_ = done_ = nullptr;
    stream_ = nullptr;
  }

  Status AllReduceValues(double* values, int count) override;
  Status StartAllReduce(void* data, int64_t count, ReduceDtype dtype, void* stream) override;
  void MarkBackwardEnd(void* stream) override {
    cudaEventRecord(backward_end_, static_cast<cudaStream_t>(stream));
    marked_ = true;
  }
  Status Finish(void* stream) override;
  CommTimings LastTimings() const override { return last_; }

  // Polls the communicator until its last call completed; fails on abort, error or timeout.
  Status WaitForComm(const char* what, Clock::time_point deadline);

 private:
  Status FailAndAbort(const std::string& message, StatusCode code = StatusCode::kUnavailable);
  // Polls `event` (recorded on this rank's stream) until done; fails on abort, error or timeout.
  Status PollEvent(cudaEvent_t event, const char* what);
  Status Enqueue(const void* send, void* receive, size_t count, ncclDataType_t type, const char* what);

  NcclGroup* group_;
  int rank_;
  int device_;
  int world_size_ = 0;
  ncclComm_t comm_ = nullptr;
  double* values_ = nullptr;       // device buffer of AllReduceValues
  double* host_values_ = nullptr;  // pinned, so that copies back do not block the host (see PollEvent)
  cudaEvent_t values_done_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, backward_end_ = nullptr, done_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> bucket_events_;  // start, end of each sum this step
  int started_ = 0;
  int64_t bytes_ = 0;
  bool marked_ = false;
  CommTimings last_;
};

class NcclGroup final : public CommunicatorGroup {
 public:
  // All ranks in this process: rank r drives devices[r].
  NcclGroup(std::vector<int> devices, double timeout_seconds)
      : devices_(std::move(devices)), timeout_seconds_(timeout_seconds), world_size_(static_cast<int>(devices_.size())) {
    for (size_t r = 0; r < devices_.size(); ++r)
      ranks_.push_back(std::make_unique<NcclCommunicator>(this, static_cast<int>(r), devices_[r]));
  }
  // One rank of a world spanning processes, joining with `id`.
  NcclGroup(int device, int rank, int world_size, const ncclUniqueId& id, double timeout_seconds)
      : devices_{device}, timeout_seconds_(timeout_seconds), world_size_(world_size), world_id_(id),
        spans_processes_(true) {
    ranks_.push_back(std::make_unique<NcclCommunicator>(this, rank, device));
  }
  ~NcclGroup() override { ranks_.clear(); }

  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r) override { return *ranks_.at(r); }
  std::string name() const override { return "NCCL"; }
  double timeout_seconds() const { return timeout_seconds_; }

  void Abort(int failed_rank, const std::string& reason) override {
    Abort(failed_rank, reason, StatusCode::kUnavailable);
  }
  void Abort(int failed_rank, const std::string& reason, StatusCode code) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.load()) {
      abort_status_ = Status(code,
                             "data-parallel step aborted: rank " + std::to_string(failed_rank) + " failed: " + reason);
      aborted_.store(true);
    }
  }
  bool aborted() const override { return aborted_.load(); }
  Status abort_status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return abort_status_;
  }

  // Creates (or re-creates) every rank's communicator.
  Status Init() {
    for (auto& rank : ranks_) {
      rank->AbortComm();
      TIGON_RETURN_IF_ERROR(rank->CreateStream());
    }
    ncclUniqueId id = world_id_;
    ncclResult_t result = spans_processes_ ? ncclSuccess : ncclGetUniqueId(&id);
    if (result != ncclSuccess) return Status(StatusCode::kUnavailable, NcclError("ncclGetUniqueId", result));
    result = ncclGroupStart();
    for (auto& rank : ranks_) {
      if (result != ncclSuccess) break;
      DeviceScope scope(rank->device());  // NCCL takes the rank's device from the current one
      if (scope.error() != cudaSuccess) {
        result = ncclUnhandledCudaError;
        break;
      }
      result = rank->StartInit(world_size_, id);
      if (result == ncclInProgress) result = ncclSuccess;
    }
    ncclResult_t end = ncclGroupEnd();
    if (result == ncclSuccess && end != ncclSuccess && end != ncclInProgress) result = end;
    if (result != ncclSuccess) {
      for (auto& rank : ranks_) rank->AbortComm();
      return Status(StatusCode::kUnavailable, NcclError("creating the NCCL communicators", result));
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_seconds_));
    for (auto& rank : ranks_) {
      Status status = rank->WaitForComm("creating the NCCL communicators", deadline);
      if (!status.ok()) {
        for (auto& other : ranks_) other->AbortComm();
        return status;
      }
    }
    return Status::Ok();
  }

  Status Reset() override {
    if (spans_processes_) {
      for (auto& rank : ranks_) rank->AbortComm();
      return Status(StatusCode::kUnavailable,
                    "a communicator spanning processes cannot be rebuilt here: every rank needs a new NCCL unique id "
                    "from rank 0 (through the control plane)");
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_.store(false);
      abort_status_ = Status();
    }
    return Init();
  }

 private:
  std::vector<int> devices_;
  double timeout_seconds_;
  int world_size_;
  ncclUniqueId world_id_{};
  bool spans_processes_ = false;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
  mutable std::mutex mutex_;
  std::atomic<bool> aborted_{false};
  Status abort_status_;
};

Status NcclCommunicator::FailAndAbort(const std::string& message, StatusCode code) {
  group_->Abort(rank_, message, code);
  AbortComm();
  return group_->abort_status();
}

Status NcclCommunicator::WaitForComm(const char* what, Clock::time_point deadline) {
  while (true) {
    if (comm_ == nullptr) return Status(StatusCode::kUnavailable, std::string(what) + ": the communicator is gone");
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return FailAndAbort(NcclError(what, state));
    if (group_->aborted()) {
      AbortComm();
      return group_->abort_status();
    }
    if (Clock::now() > deadline)
      return FailAndAbort(std::string(what) + ": timed out after " + std::to_string(group_->timeout_seconds()) + " s",
                          StatusCode::kDeadlineExceeded);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status NcclCommunicator::StartAllReduce(void* data, int64_t count, ReduceDtype dtype, void* stream) {
  if (group_->aborted()) {
    AbortComm();
    return group_->abort_status();
  }
  if (comm_ == nullptr) return Status(StatusCode::kUnavailable, "the NCCL communicator was aborted");
  if (started_ >= static_cast<int>(bucket_events_.size())) {
    cudaEvent_t start = nullptr, end = nullptr;
    DeviceScope scope(device_);
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&end) != cudaSuccess)
      return FailAndAbort("cannot create CUDA events for the gradient sums");
    bucket_events_.emplace_back(start, end);
  }
  auto [start, end] = bucket_events_[started_];
  // The sum runs on this rank's stream after the compute stream's work that produced the gradients.
  cudaError_t error = cudaEventRecord(ready_, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) error = cudaStreamWaitEvent(stream_, ready_, 0);
  if (error == cudaSuccess) error = cudaEventRecord(start, stream_);
  if (error != cudaSuccess) return FailAndAbort(CudaError("ordering a gradient sum after backward", error));
  const ncclDataType_t type = dtype == ReduceDtype::kFloat64   ? ncclFloat64
                              : dtype == ReduceDtype::kFloat32 ? ncclFloat32
                                                               : ncclBfloat16;
  TIGON_RETURN_IF_ERROR(Enqueue(data, data, static_cast<size_t>(count), type, "ncclAllReduce"));
  error = cudaEventRecord(end, stream_);
  if (error != cudaSuccess) return FailAndAbort(CudaError("recording a gradient sum", error));
  ++started_;
  bytes_ += count * ReduceDtypeBytes(dtype);
  return Status::Ok();
}

Status NcclCommunicator::Enqueue(const void* send, void* receive, size_t count, ncclDataType_t type,
                                 const char* what) {
  ncclResult_t result = ncclAllReduce(send, receive, count, type, ncclSum, comm_, stream_);
  if (result == ncclInProgress) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(group_->timeout_seconds()));
    return WaitForComm(what, deadline);
  }
  if (result != ncclSuccess) return FailAndAbort(NcclError(what, result));
  return Status::Ok();
}

Status NcclCommunicator::PollEvent(cudaEvent_t event, const char* what) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(group_->timeout_seconds()));
  // Poll instead of cudaEventSynchronize: a rank whose peer died must be able to give up.
  while (true) {
    cudaError_t error = cudaEventQuery(event);
    if (error == cudaSuccess) return Status::Ok();
    if (error != cudaErrorNotReady) return FailAndAbort(CudaError(what, error));
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
      return FailAndAbort(NcclError(what, state));
    if (group_->aborted()) {
      AbortComm();
      return group_->abort_status();
    }
    if (Clock::now() > deadline)
      return FailAndAbort(std::string(what) + ": timed out after " + std::to_string(group_->timeout_seconds()) +
                              " s waiting for the other ranks",
                          StatusCode::kDeadlineExceeded);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status NcclCommunicator::AllReduceValues(double* values, int count) {
  if (group_->aborted()) {
    AbortComm();
    return group_->abort_status();
  }
  if (comm_ == nullptr) return Status(StatusCode::kUnavailable, "the NCCL communicator was aborted");
  constexpr int kMaxValues = 64;
  if (count > kMaxValues) return Status(StatusCode::kInternal, "AllReduceValues takes at most 64 values");
  DeviceScope scope(device_);
  if (values_ == nullptr) {
    cudaError_t error = cudaMalloc(reinterpret_cast<void**>(&values_), kMaxValues * sizeof(double));
    if (error == cudaSuccess) error = cudaMallocHost(reinterpret_cast<void**>(&host_values_), kMaxValues * sizeof(double));
    if (error == cudaSuccess) error = cudaEventCreateWithFlags(&values_done_, cudaEventDisableTiming);
    if (error != cudaSuccess) return FailAndAbort(CudaError("allocating the value buffer", error));
  }
  const size_t bytes = static_cast<size_t>(count) * sizeof(double);
  std::copy(values, values + count, host_values_);
  cudaError_t error = cudaMemcpyAsync(values_, host_values_, bytes, cudaMemcpyHostToDevice, stream_);
  if (error != cudaSuccess) return FailAndAbort(CudaError("copying values to the device", error));
  TIGON_RETURN_IF_ERROR(Enqueue(values_, values_, static_cast<size_t>(count), ncclFloat64, "ncclAllReduce (values)"));
  error = cudaMemcpyAsync(host_values_, values_, bytes, cudaMemcpyDeviceToHost, stream_);
  if (error == cudaSuccess) error = cudaEventRecord(values_done_, stream_);
  if (error != cudaSuccess) return FailAndAbort(CudaError("copying values from the device", error));
  TIGON_RETURN_IF_ERROR(PollEvent(values_done_, "summing values over the ranks"));
  std::copy(host_values_, host_values_ + count, values);
  return Status::Ok();
}

Status NcclCommunicator::Finish(void* stream) {
  CommTimings timings;
  timings.collectives = started_;
  timings.bytes = bytes_;
  const int started = started_;
  started_ = 0;
  bytes_ = 0;
  if (comm_ == nullptr || group_->aborted()) {
    AbortComm();
    return group_->aborted() ? group_->abort_status()
                             : Status(StatusCode::kUnavailable, "the NCCL communicator was aborted");
  }
  cudaError_t error = cudaEventRecord(done_, stream_);
  if (error != cudaSuccess) return FailAndAbort(CudaError("recording the end of the gradient sums", error));
  TIGON_RETURN_IF_ERROR(PollEvent(done_, "waiting for the gradient sums"));
  error = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0);
  if (error != cudaSuccess) return FailAndAbort(CudaError("ordering the step after the gradient sums", error));
  for (int i = 0; i < started; ++i) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, bucket_events_[i].first, bucket_events_[i].second) == cudaSuccess)
      timings.comm_ms += ms;
  }
  if (marked_ && cudaEventSynchronize(backward_end_) == cudaSuccess) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, backward_end_, done_) == cudaSuccess) timings.exposed_ms = ms > 0 ? ms : 0.0;
  }
  marked_ = false;
  last_ = timings;
  return Status::Ok();
}

}  // namespace

bool NcclAvailable() { return true; }

Status NewNcclUniqueId(std::string* unique_id) {
  ncclUniqueId id;
  ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return Status(StatusCode::kUnavailable, NcclError("ncclGetUniqueId", result));
  unique_id->assign(id.internal, sizeof id.internal);
  return Status::Ok();
}

Status MakeNcclWorldGroup(int device, int rank, int world_size, const std::string& unique_id,
                          double timeout_seconds, std::unique_ptr<CommunicatorGroup>* group) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal)
    return Status(StatusCode::kInvalidArgument, "an NCCL unique id has " + std::to_string(sizeof id.internal) +
                                                    " bytes, got " + std::to_string(unique_id.size()));
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  auto nccl = std::make_unique<NcclGroup>(device, rank, world_size, id, timeout_seconds);
  TIGON_RETURN_IF_ERROR(nccl->Init());
  *group = std::move(nccl);
  return Status::Ok();
}

Status MakeNcclCommunicatorGroup(const std::vector<int>& devices, double timeout_seconds,
                                 std::unique_ptr<CommunicatorGroup>* group) {
  auto nccl = std::make_unique<NcclGroup>(devices, timeout_seconds);
  TIGON_RETURN_IF_ERROR(nccl->Init());
  *group = std::move(nccl);
  return Status::Ok();
}

#endif  // TIGON_WITH_NCCL

}  // namespace tigon::engine
