// A single-device session seen as one replica of a data-parallel session: what the data-parallel layer
// needs beyond the public Session calls (session.cpp implements it).
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

#include "models/model.h"
#include "session/flat_parameters.h"
#include "tigon/engine.h"

namespace tigon::engine {

class ReplicaSession : public Session {
 public:
  virtual torch::Device device() const = 0;
  virtual models::DecoderModel& model() = 0;
  virtual FlatParameters& flat() = 0;
  // Forward and backward of rows already checked as part of a whole batch; the rows may hold no target
  // token. Adds to the pending gradients; on failure drops all of them, like ForwardBackward.
  virtual Status ForwardBackwardRows(const Batch& rows, StepStats* stats) = 0;
  // Forward of rows already checked as part of a whole batch (they may hold no target token).
  virtual Status ForwardRows(const Batch& rows, ForwardResult* result) = 0;
  virtual int64_t pending_tokens() const = 0;
  // The target tokens the pending gradients come from, over every replica (the optimizer's normaliser).
  virtual void SetPendingTokens(int64_t tokens) = 0;
  virtual void DropPendingGradients() = 0;
  // Called on the failing thread as soon as forward_backward fails, before any cleanup.
  virtual void SetFailureListener(std::function<void()> listener) = 0;
  // The devices Info() reports.
  virtual void SetReportedDevices(std::vector<int> devices) = 0;
};

// A session on `device` (CPU or one CUDA device) built from `options` (options.devices is ignored).
Status CreateReplicaSession(const SessionOptions& options, torch::Device device,
                            std::unique_ptr<ReplicaSession>* replica);

}  // namespace tigon::engine
