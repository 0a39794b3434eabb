// Data parallelism: one replica (a single-device session, replica.h) per device, each batch split by rows
// across them, every replica's forward and backward on its own thread, gradient buckets summed across the
// replicas while backward still runs (gradient_buckets.h, communicator.h), and the same AdamW update on
// every replica's copy of the summed gradient, so weights stay bit-identical across replicas.
//
// Semantics are those of one device on the whole batch: losses are summed over target tokens and the
// optimizer normalises by all pending target tokens, the reported loss, tokens and grad norm are the whole
// batch's, gradient accumulation over several forward_backward calls works, and clipping uses the global
// norm. Accumulation: after a step's sum every replica holds the same total, so before the next backward
// every replica but the first zeroes its buffer; the next sum then adds only the new gradients.
//
// Failure: a replica that fails (an error, out of memory on one device, a fault injected by a test) aborts
// the communicator group, so no replica waits for it; the call fails on every replica with the failing
// replica's status, pending gradients are dropped everywhere, the group is reset and the session stays
// usable. When the replicas can no longer be known to hold the same weights (an update or a checkpoint load
// that failed on some of them only), the session reports itself broken.
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>

#include "parallel/communicator.h"
#include "parallel/gradient_buckets.h"
#include "parallel/replica.h"
#include "parallel/replica_threads.h"
#include "parallel/step_marks.h"
#include "runtime/clock.h"
#include "runtime/device_memory.h"
#include "runtime/exception_status.h"
#include "runtime/log.h"
#include "session/step_stats.h"
#include "testing/test_hooks.h"
#include "tigon/data_parallel.h"

namespace tigon {
namespace engine {
namespace {

class DataParallelSession final : public Session {
 public:
  DataParallelSession(std::vector<std::unique_ptr<ReplicaSession>> replicas,
                      std::unique_ptr<CommunicatorGroup> group, DataParallelOptions options,
                      std::vector<int> devices)
      : replicas_(std::move(replicas)), group_(std::move(group)), options_(std::move(options)),
        threads_(static_cast<int>(replicas_.size())) {
    const int64_t bucket_bytes = options_.bucket_bytes > 0 ? options_.bucket_bytes : kDefaultBucketBytes;
    for (int r = 0; r < static_cast<int>(replicas_.size()); ++r) {
      auto& replica = replicas_[r];
      replica->SetReportedDevices(devices);
      replica->SetFailureListener([this, r] { OnReplicaFailed(r, "its forward_backward failed"); });
      buckets_.push_back(std::make_unique<GradientBuckets>(replica->model(), replica->flat(), bucket_bytes));
      marks_.push_back(std::make_unique<StepMarks>(replica->device()));
    }
    spans_processes_ = group_->rank(0).size() > static_cast<int>(replicas_.size());
    limits_ = BatchLimitsOf(replicas_[0]->Info());
    const auto dtype = replicas_[0]->flat().grads().scalar_type();
    reduce_dtype_ = dtype == torch::kFloat ? ReduceDtype::kFloat32 : ReduceDtype::kBFloat16;
  }

  int replicas() const { return static_cast<int>(replicas_.size()); }

  // Ranks in other processes built their models themselves: every rank takes rank 0's weights (a sum
  // where every other rank contributes zeros is exact).
  Status TakeWeightsOfRankZero() {
    for (int r = 0; r < replicas(); ++r) {
      auto& flat = replicas_[r]->flat();
      auto& comm = group_->rank(r);
      c10::DeviceGuard guard(replicas_[r]->device());
      torch::NoGradGuard no_grad;
      if (comm.rank() != 0) flat.params().zero_();
      const auto dtype = flat.params().scalar_type() == torch::kFloat ? ReduceDtype::kFloat32 : ReduceDtype::kBFloat16;
      void* stream = CurrentStream(replicas_[r]->device());
      TIGON_RETURN_IF_ERROR(comm.StartAllReduce(flat.params().data_ptr(), flat.params().numel(), dtype, stream));
      comm.MarkBackwardEnd(stream);
      TIGON_RETURN_IF_ERROR(comm.Finish(stream));
      flat.ResetOptimizerState();
    }
    return Status::Ok();
  }
  const DataParallelTimings& timings() const { return timings_; }
  void set_fault_injector(testing::FaultInjector injector) { fault_injector_ = std::move(injector); }

  SessionInfo Info() const override {
    SessionInfo info = replicas_[0]->Info();
    info.accumulated_batches = pending_batches_;
    return info;
  }

  Status ForwardBackward(const Batch& batch, const CallContext& context, StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckUsable());
    // The context first: a rank of a session over several processes that leaves after agreeing on the
    // batch would leave the others waiting in the gradient sums.
    TIGON_RETURN_IF_ERROR(context.Check("before the step started"));
    TIGON_RETURN_IF_ERROR(CheckTrainingBatch(batch));
    const bool first_of_step = pending_batches_ == 0;
    StepStats out;
    TIGON_RETURN_IF_ERROR(RunForwardBackward(batch, &out));
    if (first_of_step) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
    StampWallTime(start, &out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status OptimStep(const OptimizerOverrides& overrides, const CallContext& context, StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckUsable());
    if (pending_batches_ == 0)
      return Status(StatusCode::kFailedPrecondition,
                    "optim_step needs accumulated gradients: call forward_backward first");
    TIGON_RETURN_IF_ERROR(ApplyOptimizerOverrides(Info().optimizer, overrides, nullptr));
    TIGON_RETURN_IF_ERROR(context.Check("before the update"));
    StepStats out;
    TIGON_RETURN_IF_ERROR(RunOptimStep(overrides, &out));
    StampWallTime(start, &out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status TrainStep(const Batch& batch, const OptimizerOverrides& overrides, const CallContext& context,
                   StepStats* stats) override {
    const auto start = Clock::now();
    TIGON_RETURN_IF_ERROR(CheckUsable());
    TIGON_RETURN_IF_ERROR(context.Check("before the step started"));  // first: see ForwardBackward
    TIGON_RETURN_IF_ERROR(CheckTrainingBatch(batch));
    TIGON_RETURN_IF_ERROR(ApplyOptimizerOverrides(Info().optimizer, overrides, nullptr));
    const bool joins_pending = pending_batches_ > 0;
    StepStats out;
    TIGON_RETURN_IF_ERROR(RunForwardBackward(batch, &out));
    if (!joins_pending) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
    StepStats update;
    TIGON_RETURN_IF_ERROR(RunOptimStep(overrides, &update));
    MergeUpdateStats(update, &out);
    StampWallTime(start, &out);
    if (stats) *stats = out;
    return Status::Ok();
  }

  Status Forward(const Batch& batch, const CallContext& context, ForwardResult* result) override {
    TIGON_RETURN_IF_ERROR(CheckUsable());
    TIGON_RETURN_IF_ERROR(CheckRows(batch));
    TIGON_RETURN_IF_ERROR(context.Check("before the forward pass started"));
    // No collectives here, so a batch with fewer rows than replicas simply uses fewer of them.
    const int used = static_cast<int>(std::min<int64_t>(batch.batch, replicas()));
    const auto counts = SplitRows(batch.batch, used);
    std::vector<ForwardResult> parts(used);
    std::vector<Status> statuses(used);
    threads_.Run(used, [&](int r) {
      int64_t first = 0;
      for (int k = 0; k < r; ++k) first += counts[k];
      statuses[r] = replicas_[r]->ForwardRows(SliceRows(batch, first, counts[r]), &parts[r]);
    });
    for (int r = 0; r < used; ++r) {
      if (!statuses[r].ok()) return Annotate(statuses[r], r, "forward");
    }
    ForwardResult out;
    double loss_sum = 0.0;
    for (auto& part : parts) {
      out.tokens += part.tokens;
      loss_sum += part.loss * static_cast<double>(part.tokens);
      for (const auto& [name, value] : part.metrics) out.metrics[name] += value * static_cast<double>(part.tokens);
      out.logprobs.insert(out.logprobs.end(), part.logprobs.begin(), part.logprobs.end());
    }
    out.loss = out.tokens > 0 ? loss_sum / static_cast<double>(out.tokens) : 0.0;
    for (auto& [name, sum] : out.metrics) sum = out.tokens > 0 ? sum / static_cast<double>(out.tokens) : 0.0;
    if (result) *result = std::move(out);
    return Status::Ok();
  }

  Status DiscardGradients() override {
    TIGON_RETURN_IF_ERROR(CheckUsable());
    for (auto& replica : replicas_) replica->DropPendingGradients();
    pending_batches_ = 0;
    pending_tokens_ = 0;
    return Status::Ok();
  }

  Status SaveCheckpointAt(int parent_fd, const std::string& name, const std::string& label) override {
    TIGON_RETURN_IF_ERROR(CheckUsable());
    // Every replica holds the same weights and optimizer state.
    return replicas_[0]->SaveCheckpointAt(parent_fd, name, label);
  }

  Status LoadCheckpointAt(int dir_fd, const std::string& label) override {
    TIGON_RETURN_IF_ERROR(CheckUsable());
    // The first replica checks everything before changing anything; the others then read the same files.
    TIGON_RETURN_IF_ERROR(replicas_[0]->LoadCheckpointAt(dir_fd, label));
    pending_batches_ = 0;
    pending_tokens_ = 0;
    std::vector<Status> statuses(replicas());
    threads_.Run(replicas(), [&](int r) {
      if (r > 0) statuses[r] = replicas_[r]->LoadCheckpointAt(dir_fd, label);
    });
    for (int r = 1; r < replicas(); ++r) {
      if (!statuses[r].ok()) {
        broken_ = Annotate(statuses[r], r, "load_checkpoint");
        broken_ = Status(StatusCode::kInternal, broken_.message() + "; replica 0 had loaded it, so the replicas "
                                                                    "no longer hold the same weights");
        return broken_;
      }
    }
    return Status::Ok();
  }

 private:
  // The first failure of a step names its root cause; the abort releases replicas waiting for this one.
  void OnReplicaFailed(int r, const std::string& reason) {
    int none = -1;
    first_failed_.compare_exchange_strong(none, r);
    group_->Abort(r, reason);
  }

  Status CheckUsable() const {
    if (broken_.ok()) return Status::Ok();
    return Status(StatusCode::kUnavailable, "this data-parallel session is broken and must be closed: " +
                                                broken_.message());
  }

  // The batch contract, and over several replicas (which hold different rows) an objective that allows it.
  Status CheckRows(const Batch& batch) const {
    TIGON_RETURN_IF_ERROR(CheckBatch(batch, limits_));
    return replicas() > 1 || spans_processes_ ? CheckObjectiveSplitsOverRows(batch) : Status::Ok();
  }

  // Ranks in other processes check their own rows; all of them must agree before any collective starts
  // (a rank that refused its rows would leave the others waiting in the gradient sums).
  Status AgreeOnBatch(const Batch& batch) {
    Status local = CheckRows(batch);
    double refusals = local.ok() ? 0.0 : 1.0;
    Status summed = group_->rank(0).AllReduceValues(&refusals, 1);
    if (!summed.ok()) {
      broken_ = Status(StatusCode::kUnavailable, "the ranks could not agree on a batch: " + summed.message());
      return broken_;
    }
    if (!local.ok()) return local;
    if (refusals > 0)
      return Status(StatusCode::kInvalidArgument,
                    std::to_string(static_cast<int>(refusals)) + " other rank(s) refused their rows of this batch");
    return Status::Ok();
  }

  Status CheckTrainingBatch(const Batch& batch) {
    if (spans_processes_) return AgreeOnBatch(batch);
    TIGON_RETURN_IF_ERROR(CheckRows(batch));
    if (batch.batch < replicas())
      return Status(StatusCode::kInvalidArgument,
                    "a batch of " + std::to_string(batch.batch) + " row(s) cannot be split over " +
                        std::to_string(replicas()) + " data-parallel replicas: give at least one row per replica");
    return Status::Ok();
  }

  // After the forward-backward pass of a step that started without pending gradients: a call no longer
  // wanted drops them on every replica. A rank of a session over several processes goes on: its gradients
  // are already summed with the other ranks', which apply them.
  Status DropIfUnwanted(const CallContext& context) {
    if (spans_processes_) return Status::Ok();
    Status wanted = context.Check("during the forward and backward pass");
    if (wanted.ok()) return wanted;
    for (auto& replica : replicas_) replica->DropPendingGradients();
    pending_batches_ = 0;
    pending_tokens_ = 0;
    Logf(LogLevel::kInfo, "the caller gave up during the forward and backward pass; its gradients were dropped on "
                          "every replica, no update applied");
    return wanted;
  }

  std::string ReplicaName(int r) const {
    const auto device = replicas_[r]->device();
    return "replica " + std::to_string(r) + " (" + device.str() + ")";
  }

  Status Annotate(const Status& status, int r, const char* call) const {
    return Status(status.code(), ReplicaName(r) + " failed in " + call + ": " + status.message());
  }

  void Inject(int r, const std::string& point) const {
    if (fault_injector_) fault_injector_(r, point);
  }

  // After a failure on some replica: every replica drops its pending gradients, the group is reset.
  Status FailStep(const std::vector<Status>& statuses, int first_failed, const char* call) {
    // Reset first: aborted collectives must have stopped writing into the gradient buffers.
    Status reset = group_->Reset();
    for (auto& replica : replicas_) replica->DropPendingGradients();
    for (auto& buckets : buckets_) buckets->Disarm();
    const int64_t dropped = pending_batches_;
    pending_batches_ = 0;
    pending_tokens_ = 0;
    if (first_failed < 0 || statuses[first_failed].ok()) {
      first_failed = 0;
      while (statuses[first_failed].ok()) ++first_failed;
    }
    const Status& root = statuses[first_failed];
    std::string message = ReplicaName(first_failed) + " failed in " + call + ": " + root.message() +
                          "; the step was not applied on any of the " + std::to_string(replicas()) + " replicas";
    if (dropped > 0)
      message += " and gradients pending from " + std::to_string(dropped) + " earlier call(s) were dropped";
    if (!reset.ok()) {
      broken_ = Status(StatusCode::kUnavailable, "resetting the " + group_->name() +
                                                     " communicators after a failed step failed: " + reset.message());
      message += "; " + broken_.message();
    }
    Logf(LogLevel::kWarning, call, " failed: ", message);
    return Status(root.code(), message);
  }

  Status RunForwardBackward(const Batch& batch, StepStats* out) {
    const int n = replicas();
    const auto counts = SplitRows(batch.batch, n);
    std::vector<Status> statuses(n);
    std::vector<StepStats> parts(n);
    std::vector<double> seconds(n);
    std::vector<int> after_backward(n, 0);
    std::vector<Status> comm_errors(n);  // a failed collective's own status (abort, timeout)
    std::vector<ReplicaTimings> timings(n);
    std::vector<double> first_gradient_s(n, -1.0), backward_end_s(n, -1.0);  // host seconds after the start
    first_failed_.store(-1);
    const bool accumulating = pending_batches_ > 0;
    threads_.Run(n, [&](int r) {
      const auto start = Clock::now();
      auto& replica = *replicas_[r];
      auto& buckets = *buckets_[r];
      auto& comm = group_->rank(r);
      auto& marks = *marks_[r];
      Status status;
      try {
        c10::DeviceGuard guard(replica.device());
        marks.Clear();
        marks.Record(StepMarks::kStart);
        Inject(r, "forward_backward");
        int64_t first = 0;
        for (int k = 0; k < r; ++k) first += counts[k];
        const Batch rows = SliceRows(batch, first, counts[r]);
        if (accumulating && comm.rank() != 0) {
          torch::NoGradGuard no_grad;
          replica.flat().grads().zero_();
        }
        auto grads = replica.flat().grads();
        char* base = static_cast<char*>(grads.data_ptr());
        const int64_t element = grads.element_size();
        const torch::Device device = replica.device();
        buckets.Begin(
            [&, base, element, device, r](int i) {
              Inject(r, "bucket:" + std::to_string(i));
              const auto& bucket = buckets.bucket(i);
              Status started = comm.StartAllReduce(base + bucket.offset * element, bucket.numel, reduce_dtype_,
                                                   CurrentStream(device));
              if (!started.ok()) {
                comm_errors[r] = started;
                throw std::runtime_error(started.message());
              }
            },
            [&, start, r] {  // on the autograd thread, which has the replica's device current
              first_gradient_s[r] = SecondsSince(start);
              marks.Record(StepMarks::kFirstGradient);
            });
        status = replica.ForwardBackwardRows(rows, &parts[r]);
        if (status.ok()) {
          backward_end_s[r] = SecondsSince(start);
          marks.Record(StepMarks::kBackwardEnd);
          comm.MarkBackwardEnd(CurrentStream(device));
          const auto wait_start = Clock::now();
          after_backward[r] = buckets.LaunchRemaining();
          status = comm.Finish(CurrentStream(device));
          timings[r].wait_ms = 1e3 * SecondsSince(wait_start);
        }
      } catch (const std::exception& e) {
        // The others first: returning this device's cached memory (out of memory) waits for its collectives.
        OnReplicaFailed(r, e.what());
        status = StatusFromException(e, replica.device(), "forward_backward");
      }
      if (!status.ok() && !comm_errors[r].ok()) status = comm_errors[r];
      buckets.Disarm();
      if (!status.ok()) OnReplicaFailed(r, status.message());
      statuses[r] = status;
      seconds[r] = SecondsSince(start);
      if (status.ok()) FillForwardBackwardTimings(marks, first_gradient_s[r], backward_end_s[r], &timings[r]);
      timings[r].forward_backward_ms = 1e3 * seconds[r];
    });
    for (int r = 0; r < n; ++r) {
      if (!statuses[r].ok()) return FailStep(statuses, first_failed_.load(), "forward_backward");
    }
    int64_t tokens = 0;
    double loss_sum = 0.0;
    std::map<std::string, double> metric_sums;  // token-weighted: every objective here is per token
    for (const auto& part : parts) {
      tokens += part.tokens;
      loss_sum += part.loss * static_cast<double>(part.tokens);
      for (const auto& [name, value] : part.metrics) metric_sums[name] += value * static_cast<double>(part.tokens);
      out->peak_allocated_bytes = std::max(out->peak_allocated_bytes, part.peak_allocated_bytes);
      out->peak_reserved_bytes = std::max(out->peak_reserved_bytes, part.peak_reserved_bytes);
    }
    const int64_t local_tokens = tokens;
    if (spans_processes_) {  // the whole world's loss and tokens
      double values[2] = {loss_sum, static_cast<double>(tokens)};
      statuses[0] = group_->rank(0).AllReduceValues(values, 2);
      if (!statuses[0].ok()) return FailStep(statuses, 0, "forward_backward");
      loss_sum = values[0];
      tokens = static_cast<int64_t>(std::llround(values[1]));
    }
    pending_batches_ += 1;
    pending_tokens_ += tokens;
    out->loss = tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0;
    // Ranks in other processes: this process's rows' figures.
    for (const auto& [name, sum] : metric_sums) out->metrics[name] = local_tokens > 0 ? sum / local_tokens : 0.0;
    out->tokens = tokens;
    out->step = Info().step;
    out->accumulated_batches = pending_batches_;

    const auto comm = group_->rank(0).LastTimings();
    timings_.replicas = n;
    timings_.buckets = comm.collectives;
    timings_.bucket_bytes = comm.bytes;
    timings_.allreduce_ms = comm.comm_ms;
    timings_.exposed_ms = comm.exposed_ms;
    timings_.buckets_after_backward = after_backward[0];
    timings_.forward_backward_ms = 1e3 * *std::max_element(seconds.begin(), seconds.end());
    timings_.per_replica = std::move(timings);
    return Status::Ok();
  }

  Status RunOptimStep(const OptimizerOverrides& overrides, StepStats* out) {
    const int n = replicas();
    std::vector<Status> statuses(n);
    std::vector<StepStats> parts(n);
    std::vector<double> update_ms(n, 0.0);
    threads_.Run(n, [&](int r) {
      const auto start = Clock::now();
      try {
        c10::DeviceGuard guard(replicas_[r]->device());
        Inject(r, "optim_step");
        replicas_[r]->SetPendingTokens(pending_tokens_);
        statuses[r] = replicas_[r]->OptimStep(overrides, &parts[r]);
      } catch (const std::exception& e) {
        statuses[r] = StatusFromException(e, replicas_[r]->device(), "optim_step");
        replicas_[r]->DropPendingGradients();
      }
      update_ms[r] = 1e3 * SecondsSince(start);
    });
    timings_.per_replica.resize(n);
    for (int r = 0; r < n; ++r) timings_.per_replica[r].update_ms = update_ms[r];
    pending_batches_ = 0;
    pending_tokens_ = 0;
    int failed = 0;
    for (int r = 0; r < n; ++r) failed += statuses[r].ok() ? 0 : 1;
    if (failed == 0) {
      *out = parts[0];
      for (const auto& part : parts) {
        out->peak_allocated_bytes = std::max(out->peak_allocated_bytes, part.peak_allocated_bytes);
        out->peak_reserved_bytes = std::max(out->peak_reserved_bytes, part.peak_reserved_bytes);
      }
      return Status::Ok();
    }
    for (auto& replica : replicas_) replica->DropPendingGradients();
    int first = 0;
    while (statuses[first].ok()) ++first;
    // The same refusal everywhere (e.g. a non-finite gradient norm, checked before any update) leaves the
    // replicas equal; anything else may have updated some replicas and not others.
    bool same = failed == n;
    for (int r = 0; r < n && same; ++r) same = statuses[r].code() == statuses[first].code();
    if (same && statuses[first].code() == StatusCode::kFailedPrecondition) return statuses[first];
    broken_ = Status(StatusCode::kInternal, Annotate(statuses[first], first, "optim_step").message() +
                                                "; the update may have been applied on some replicas only");
    Logf(LogLevel::kError, broken_.message());
    return Status(statuses[first].code(), broken_.message() + " (the session is now broken and must be closed)");
  }

  std::vector<std::unique_ptr<ReplicaSession>> replicas_;
  std::vector<std::unique_ptr<GradientBuckets>> buckets_;
  std::vector<std::unique_ptr<StepMarks>> marks_;
  std::unique_ptr<CommunicatorGroup> group_;
  DataParallelOptions options_;
  testing::FaultInjector fault_injector_;  // testing/test_hooks.h
  ReplicaThreads threads_;  // after everything its jobs use, so that it stops first
  ReduceDtype reduce_dtype_ = ReduceDtype::kFloat32;
  int64_t pending_batches_ = 0;
  int64_t pending_tokens_ = 0;
  Status broken_;
  bool spans_processes_ = false;  // ranks in other processes too (DataParallelOptions.world_size)
  BatchLimits limits_;            // what CheckBatch holds this session's batches to
  DataParallelTimings timings_;
  std::atomic<int> first_failed_{-1};
};

}  // namespace
}  // namespace engine

Status CreateDataParallelSession(const SessionOptions& options, const DataParallelOptions& parallel,
                                 std::unique_ptr<Session>* session) {
  using namespace engine;
  if (session == nullptr) return Status(StatusCode::kInvalidArgument, "no output session given");
  if (options.optimizer_in_backward)
    return Status(StatusCode::kInvalidArgument,
                  "optimizer_in_backward is for single-device sessions (data parallelism sums the whole gradient "
                  "buffer before the update)");
  std::vector<torch::Device> devices;
  const bool spans_processes = parallel.world_size > 0;
  if (spans_processes) {
    if (parallel.cpu_replicas != 0 || options.devices.size() != 1)
      return Status(StatusCode::kInvalidArgument, "a rank of a multi-process group drives exactly one CUDA device");
    if (parallel.rank < 0 || parallel.rank >= parallel.world_size)
      return Status(StatusCode::kInvalidArgument, "rank " + std::to_string(parallel.rank) + " is outside [0, " +
                                                      std::to_string(parallel.world_size) + ")");
    if (!NcclAvailable())
      return Status(StatusCode::kInvalidArgument, "ranks in several processes need NCCL, which this build lacks");
  }
  if (parallel.cpu_replicas > 0) {
    if (!options.devices.empty())
      return Status(StatusCode::kInvalidArgument, "CPU replicas and CUDA devices cannot be combined");
    devices.assign(parallel.cpu_replicas, torch::Device(torch::kCPU));
  } else {
    if (parallel.cpu_replicas < 0) return Status(StatusCode::kInvalidArgument, "cpu_replicas must be >= 0");
    const auto available = ListDevices();
    std::set<int> seen;
    for (int index : options.devices) {
      if (!seen.insert(index).second)
        return Status(StatusCode::kInvalidArgument,
                      "device " + std::to_string(index) + " is listed more than once; give each device once");
    }
    for (int index : options.devices) {
      if (index < 0 || index >= static_cast<int>(available.size()))
        return Status(StatusCode::kInvalidArgument, "device " + std::to_string(index) + " does not exist (" +
                                                        std::to_string(available.size()) +
                                                        " CUDA device(s) present)");
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
    if (devices.empty())
      return Status(StatusCode::kInvalidArgument, "a data-parallel session needs CUDA devices or CPU replicas");
    if (!NcclAvailable())
      return Status(StatusCode::kInvalidArgument,
                    "sessions over several CUDA devices need NCCL, which this build does not have");
  }
  if (!(parallel.collective_timeout_seconds > 0))
    return Status(StatusCode::kInvalidArgument, "collective_timeout_seconds must be > 0");
  try {
    std::vector<std::unique_ptr<ReplicaSession>> replicas;
    for (const auto& device : devices) {
      std::unique_ptr<ReplicaSession> replica;
      TIGON_RETURN_IF_ERROR(CreateReplicaSession(options, device, &replica));
      replicas.push_back(std::move(replica));
    }
    // Same weights everywhere, whatever each device's random generator would have drawn.
    {
      torch::NoGradGuard no_grad;
      for (size_t r = 1; r < replicas.size(); ++r) {
        replicas[r]->flat().params().copy_(replicas[0]->flat().params());
        replicas[r]->flat().ResetOptimizerState();
      }
    }
    std::unique_ptr<CommunicatorGroup> group;
    std::vector<int> device_indices;
    if (parallel.cpu_replicas > 0) {
      group = MakeHostCommunicatorGroup(parallel.cpu_replicas, parallel.collective_timeout_seconds);
    } else if (spans_processes) {
      device_indices = options.devices;
      TIGON_RETURN_IF_ERROR(MakeNcclWorldGroup(device_indices.front(), parallel.rank, parallel.world_size,
                                               parallel.nccl_unique_id, parallel.collective_timeout_seconds,
                                               &group));
    } else {
      device_indices = options.devices;
      TIGON_RETURN_IF_ERROR(MakeNcclCommunicatorGroup(device_indices, parallel.collective_timeout_seconds, &group));
    }
    auto dp = std::make_unique<DataParallelSession>(std::move(replicas), std::move(group), parallel, device_indices);
    if (spans_processes) TIGON_RETURN_IF_ERROR(dp->TakeWeightsOfRankZero());
    const auto info = dp->Info();
    Logf(LogLevel::kInfo, "created data-parallel session: ", info.model_family, " ", info.parameter_count,
         " parameters, ", options.precision, ", ", devices.size(), " replicas on ",
         parallel.cpu_replicas > 0 ? std::string("the CPU") : devices.front().str() + "...");
    *session = std::move(dp);
    return Status::Ok();
  } catch (const std::exception& e) {
    return StatusFromException(e, devices.empty() ? torch::Device(torch::kCPU) : devices.front(), "create_session");
  }
}

Status NewNcclUniqueId(std::string* unique_id) {
  if (unique_id == nullptr) return Status(StatusCode::kInvalidArgument, "no output id given");
  return engine::NewNcclUniqueId(unique_id);
}

bool LastDataParallelTimings(const Session& session, DataParallelTimings* timings) {
  const auto* dp = dynamic_cast<const engine::DataParallelSession*>(&session);
  if (dp == nullptr) return false;
  if (timings) *timings = dp->timings();
  return true;
}

bool testing::SetFaultInjector(Session& session, FaultInjector injector) {
  auto* dp = dynamic_cast<engine::DataParallelSession*>(&session);
  if (dp == nullptr) return false;
  dp->set_fault_injector(std::move(injector));
  return true;
}

}  // namespace tigon
