// Data-parallel sessions beyond what engine.h's SessionOptions.devices gives: replicas on the CPU (how
// CI tests the data-parallel logic without GPUs), the gradient bucket size, the collective timeout, and
// per-step communication timings for benchmarks. No torch types.
//
// CreateSession(options) with options.devices = {0, 1, ...} (two or more distinct CUDA devices) builds the
// same session as CreateDataParallelSession(options, {}) below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon {

struct DataParallelOptions {
  // > 0: that many replicas on the CPU with an in-process host communicator (options.devices must be
  // empty). 0: one replica per CUDA device in options.devices, summed with NCCL.
  int cpu_replicas = 0;
  // Gradients are summed in buckets of about this many bytes of the flat gradient buffer, each started as
  // soon as backward has finished every gradient in it. 0: kDefaultBucketBytes.
  int64_t bucket_bytes = 0;
  // A rank that waits longer than this for the others (a hung or dead rank) fails the step.
  double collective_timeout_seconds = 300.0;
  // Ranks in several processes (one per GPU or per host): world_size > 0 makes this process rank `rank` of
  // `world_size`, with one replica on options.devices[0] (exactly one device). Every rank passes the same
  // nccl_unique_id (NewNcclUniqueId on rank 0, handed to the others by the caller, e.g. over the servers'
  // gRPC control plane) and makes the same calls in the same order, each with its own rows of the batch;
  // loss, tokens and grad norm are then the whole world's. A rank that fails makes the others fail when
  // their collective timeout expires; the session is then broken (a new unique id is needed).
  int world_size = 0;
  int rank = 0;
  std::string nccl_unique_id;
};

// 256 MiB: on two H200s (Llama-3.2-1B, one process per GPU) 9 buckets gave 1.903x against 1.884x with 26
// buckets of 64 MiB; fewer NCCL launches, each of which takes SMs from backward while it waits for its peer.
inline constexpr int64_t kDefaultBucketBytes = int64_t{256} << 20;

Status CreateDataParallelSession(const SessionOptions& options, const DataParallelOptions& parallel,
                                 std::unique_ptr<Session>* session);

// A fresh NCCL unique id (128 bytes) for DataParallelOptions.nccl_unique_id. The process that makes it
// serves the ranks' rendezvous, so it must live until every rank has joined.
Status NewNcclUniqueId(std::string* unique_id);

// The rows of `batch` that rank `rank` of `world_size` trains on when each process holds one rank: the
// split a data-parallel session makes over its devices (as even as possible, the first ranks taking one
// more), so that ranks in several processes see together what one session over their devices sees.
Batch RowsOfRank(const Batch& batch, int rank, int world_size);

// An NCCL unique id as hex text and back, for handing it to other processes in a flag or an environment
// variable. false for text that is not hex of an even length.
std::string UniqueIdToHex(const std::string& unique_id);
bool UniqueIdFromHex(const std::string& hex, std::string* unique_id);

// Where one replica's time went in the last step. CUDA replicas time forward and backward with CUDA events
// on the replica's compute stream (device time); CPU replicas with the host clock.
struct ReplicaTimings {
  double forward_ms = 0.0;   // start of forward to the first finished gradient (forward, loss, output layer)
  double backward_ms = 0.0;  // first finished gradient to the end of backward
  double wait_ms = 0.0;      // host time waiting for the gradient sums after backward
  double update_ms = 0.0;    // host time of the optimizer step (it ends with a device synchronisation)
  double forward_backward_ms = 0.0;  // host time of this replica's whole forward_backward
  // Host time from the start of forward to the first finished gradient, i.e. until the host had launched
  // that much: close to forward_ms when launching kernels, not the device, limits the step.
  double host_forward_ms = 0.0;
};

// Communication of the last forward_backward (or train_step) on replica 0.
struct DataParallelTimings {
  int replicas = 0;
  int buckets = 0;               // gradient buckets summed
  int buckets_after_backward = 0;  // of those, started only after backward (no overlap)
  int64_t bucket_bytes = 0;      // bytes summed per replica
  double allreduce_ms = 0.0;     // total time of the sums
  double exposed_ms = 0.0;       // end of backward to end of the last sum: communication not hidden
  double forward_backward_ms = 0.0;  // wall time of the replicas' forward+backward (slowest replica)
  std::vector<ReplicaTimings> per_replica;  // this process's replicas, in order
};

// False when `session` is not data-parallel.
bool LastDataParallelTimings(const Session& session, DataParallelTimings* timings);

// A Kineto trace of this process for benchmarks: CPU operators of every thread that runs engine calls
// (replica threads included) and the CUDA kernels of every device. StopTrace writes a Chrome trace JSON
// (bench/analyze_trace.py reads it). FAILED_PRECONDITION where LibTorch cannot profile (no Kineto) or
// when no trace is (or one already is) running. Call both from the thread that makes the engine calls.
Status StartTrace();
Status StopTrace(const std::string& chrome_trace_path);

}  // namespace tigon
