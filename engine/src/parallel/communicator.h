// Collective communication for data parallelism: sums of gradient buffers across the ranks of a group.
// No torch types: the NCCL implementation compiles against the CUDA toolkit alone (in CI too), and the host
// implementation is plain C++.
//
// A group holds one Communicator per rank of this process. Each rank calls its communicator from one thread
// at a time and every rank starts the same collectives in the same order. When one rank fails mid-step it
// calls Abort, and every rank's pending and later collectives fail fast instead of waiting for it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon::engine {

enum class ReduceDtype { kFloat32, kBFloat16, kFloat64 };

inline int64_t ReduceDtypeBytes(ReduceDtype dtype) {
  return dtype == ReduceDtype::kFloat64 ? 8 : dtype == ReduceDtype::kFloat32 ? 4 : 2;
}

// Time spent on collectives during one backward pass on one rank.
struct CommTimings {
  int collectives = 0;
  int64_t bytes = 0;
  double comm_ms = 0.0;     // total time the sums took
  double exposed_ms = 0.0;  // from the end of the rank's backward to the end of its last sum
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // This rank's place among all ranks of every process (the world), and the world's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums a few host values over all ranks and returns when done (token counts, losses, agreement flags).
  virtual Status AllReduceValues(double* values, int count) = 0;
  // Starts an in-place sum of `count` elements at `data` over all ranks. `stream` is the CUDA stream
  // (cudaStream_t) whose queued work produced the data, or null on the host; a device communicator runs the
  // sum after that work on its own stream and returns at once, the host one returns when the sum is done.
  virtual Status StartAllReduce(void* data, int64_t count, ReduceDtype dtype, void* stream) = 0;
  // Marks the end of this rank's backward on `stream` (the start of the exposed communication time).
  virtual void MarkBackwardEnd(void* stream) = 0;
  // Waits until every started sum finished (failing on abort or
  // timeout instead of hanging), and orders later work on `stream` after them. Resets the timings.
  virtual Status Finish(void* stream) = 0;
  // Timings of the collectives between the last two Finish calls.
  virtual CommTimings LastTimings() const = 0;
};

class CommunicatorGroup {
 public:
  virtual ~CommunicatorGroup() = default;
  // Ranks in this process (the world may hold more, in other processes).
  virtual int size() const = 0;
  virtual Communicator& rank(int r) = 0;
  // Called by a failing rank (or the coordinator): every rank's pending and later collectives fail with a
  // status naming `failed_rank` and `reason`, until Reset.
  virtual void Abort(int failed_rank, const std::string& reason) = 0;
  virtual bool aborted() const = 0;
  // After a failed step, once no rank is inside a collective: makes the group usable again (NCCL: new
  // communicators). A failure here leaves the group unusable.
  virtual Status Reset() = 0;
  virtual std::string name() const = 0;
};

// Ranks that are threads of this process, summing host memory in rank order (results are deterministic and
// identical on every rank). Used for CPU replicas: CI tests of the data-parallel logic.
std::unique_ptr<CommunicatorGroup> MakeHostCommunicatorGroup(int size, double timeout_seconds);

// One NCCL communicator per CUDA device in `devices` (rank r = devices[r]), created non-blocking so that a
// failed rank can be aborted with ncclCommAbort. Only in builds with NCCL (TIGON_WITH_NCCL).
Status MakeNcclCommunicatorGroup(const std::vector<int>& devices, double timeout_seconds,
                                 std::unique_ptr<CommunicatorGroup>* group);
bool NcclAvailable();

// One rank of a world that spans processes: this process drives CUDA device `device` as rank `rank` of
// `world_size`, joining with the 128-byte NCCL unique id made by NewNcclUniqueId on rank 0 and handed to
// every rank by the caller. Such a group cannot rebuild itself after a failure (Reset fails): a new id must
// come through the control plane.
Status MakeNcclWorldGroup(int device, int rank, int world_size, const std::string& unique_id,
                          double timeout_seconds, std::unique_ptr<CommunicatorGroup>* group);
Status NewNcclUniqueId(std::string* unique_id);

// Rounding of fp32 to bf16 (nearest, ties to even) and back, for the host communicator's bf16 sums.
inline float Bf16BitsToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  static_assert(sizeof f == sizeof u);
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tigon::engine
