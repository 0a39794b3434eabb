// MeasureSavings: the session's model built twice more, with every op fused and every op reference, and
// one timed training step of each on random tokens; the session itself is not touched.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "server/trainer_service.h"
#include "server/validation.h"

namespace tigon::server {

// ---- memory savings -------------------------------------------------------------------------------

grpc::Status TrainerService::MeasureSavings(grpc::ServerContext* ctx, const v1::MeasureSavingsRequest* request,
                                            v1::MeasureSavingsResponse* response) {
  v1::Batch batch;
  SessionCall<v1::MeasureSavingsResponse> call{"MeasureSavings", &request->session_id(), Lock::kNone};
  call.check = [&](const SessionEntry& entry, const Caller&, const tigon::CallContext&) {
    if (entry.world.world_size > 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                   "MeasureSavings builds temporary copies of the session on this server alone; a rank of a session "
                   "over several servers cannot be copied that way");
    }
    // Random tokens of the requested shape, checked like any batch (limits included).
    const BatchLimits limits{entry.vocab_size, entry.max_position_embeddings, config_.max_batch_tokens};
    grpc::Status status = ValidateBatchShape(request->batch(), request->seq_len(), limits);
    if (!status.ok()) return status;
    batch.set_batch(request->batch());
    batch.set_seq_len(request->seq_len());
    std::mt19937 rng(0);
    for (int64_t i = 0; i < request->batch() * request->seq_len(); ++i) {
      batch.add_input_ids(static_cast<int32_t>(rng() % static_cast<uint32_t>(entry.vocab_size)));
    }
    return ValidateBatch(batch, limits);
  };
  // Serialised by measure_mu_ instead of the session's step lock: the session itself is not used.
  call.execute = [&](SessionEntry& entry, const tigon::CallContext& context,
                     v1::MeasureSavingsResponse* out) -> grpc::Status {
    const tigon::Batch engine_batch = ToEngineBatch(batch);
    std::lock_guard<std::mutex> measuring(measure_mu_);
    SessionRegistry::Slot slot;
    grpc::Status status = sessions_.Reserve(&slot);
    if (!status.ok()) return status;
    for (const char* kernels : {"fused", "reference"}) {
      if (std::chrono::system_clock::now() >= context.deadline) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed during the measurement");
      }
      tigon::SessionOptions options = entry.options;
      options.kernels = kernels;
      options.kernel_overrides.clear();
      std::unique_ptr<tigon::Session> twin;
      tigon::Status engine_status = engine_.create_session(options, &twin);
      if (!engine_status.ok()) return FromEngine(engine_status, entry);
      if (twin == nullptr) return grpc::Status(grpc::StatusCode::INTERNAL, "the engine created no session");
      // Two steps: the first allocates the optimizer state and warms up, the second is timed.
      tigon::StepStats first, second;
      engine_status = twin->TrainStep(engine_batch, {}, &first);
      if (engine_status.ok()) engine_status = twin->TrainStep(engine_batch, {}, &second);
      if (!engine_status.ok()) return FromEngine(engine_status, entry);
      v1::KernelMeasurement* m = std::string(kernels) == "fused" ? out->mutable_fused() : out->mutable_reference();
      m->set_kernels(kernels);
      m->set_peak_allocated_bytes(std::max(first.peak_allocated_bytes, second.peak_allocated_bytes));
      m->set_peak_reserved_bytes(std::max(first.peak_reserved_bytes, second.peak_reserved_bytes));
      m->set_step_seconds(second.wall_seconds);
      m->set_tokens_per_second(second.tokens_per_second);
      if (metrics_ != nullptr) {
        metrics_->RecordSavings(entry.id, entry.model_family, kernels, m->peak_allocated_bytes(), m->step_seconds());
      }
    }
    out->set_saved_bytes(out->reference().peak_allocated_bytes() - out->fused().peak_allocated_bytes());
    if (out->fused().step_seconds() > 0) out->set_speedup(out->reference().step_seconds() / out->fused().step_seconds());
    spdlog::info("session {} MeasureSavings {}x{}: saved {} bytes, speedup {:.3f}", entry.id, request->batch(),
                 request->seq_len(), out->saved_bytes(), out->speedup());
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

}  // namespace tigon::server
