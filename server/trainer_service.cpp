#include "server/trainer_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <type_traits>

#include "server/client_text.h"
#include "server/proto_convert.h"
#include "server/status_map.h"
#include "server/validation.h"

namespace tigon::server {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status Error(grpc::StatusCode code, const std::string& message) { return grpc::Status(code, message); }

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Runs `fn` when the scope ends (bookkeeping that must happen on every path, exceptions included).
template <typename F>
class ScopeExit {
 public:
  explicit ScopeExit(F fn) : fn_(std::move(fn)) {}
  ~ScopeExit() { fn_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  F fn_;
};

}  // namespace

TrainerService::TrainerService(ServiceConfig config, EngineApi engine, TokenAuthenticator auth,
                               CheckpointRoot checkpoints, Metrics* metrics)
    : config_(std::move(config)),
      engine_(std::move(engine)),
      auth_(std::move(auth)),
      checkpoints_(std::move(checkpoints)),
      metrics_(metrics),
      started_(Clock::now()),
      sessions_(config_.max_sessions),
      journal_(config_.journal != nullptr ? *config_.journal : journal_off_) {
  if (config_.session_idle_timeout_seconds > 0) {
    reaper_ = std::thread([this] {
      // Checks a few times per timeout, at most every 5 s.
      const auto period = std::chrono::duration<double>(std::min(5.0, config_.session_idle_timeout_seconds / 4));
      std::unique_lock<std::mutex> lock(reaper_mu_);
      while (!reaper_wake_.wait_for(lock, period, [this] { return stopping_; })) {
        lock.unlock();
        CloseIdleSessions();
        lock.lock();
      }
    });
  }
}

TrainerService::~TrainerService() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stopping_ = true;
  }
  reaper_wake_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  CloseAllSessions();
}

// ---- the calls' common parts ----------------------------------------------------------------------

grpc::Status TrainerService::Handle(const char* method, grpc::ServerContext* ctx,
                                    const std::function<grpc::Status(const Caller&)>& body) {
  const auto start = Clock::now();
  const bool admitted = calls_.Enter();
  ScopeExit done([this, admitted] {
    if (admitted) calls_.Leave();
  });
  grpc::Status status =
      admitted ? grpc::Status::OK
               : Error(grpc::StatusCode::UNAVAILABLE, "the server is shutting down and takes no new calls");
  Caller caller;
  if (status.ok()) status = auth_.Authenticate(ctx->client_metadata(), &caller);
  if (status.ok()) {
    try {
      status = body(caller);
    } catch (const std::exception& e) {
      status = Error(grpc::StatusCode::INTERNAL, std::string("internal error in ") + method + ": " + e.what());
    } catch (...) {
      status = Error(grpc::StatusCode::INTERNAL, std::string("internal error in ") + method);
    }
  }
  // Messages may quote client strings: escaped and bounded once more here, for the log and the client.
  if (!status.ok()) status = grpc::Status(status.error_code(), ClientText(status.error_message(), kStatusMessageLimit));
  const char* code = GrpcCodeName(status.error_code());
  if (status.ok()) {
    spdlog::debug("{} OK in {:.4f} s", method, SecondsSince(start));
  } else if (status.error_code() == grpc::StatusCode::INTERNAL || status.error_code() == grpc::StatusCode::UNKNOWN) {
    spdlog::error("{} {}: {}", method, code, status.error_message());
  } else {
    spdlog::info("{} {}: {}", method, code, status.error_message());
  }
  if (metrics_ != nullptr) metrics_->RecordRpc(method, code);
  return status;
}

template <typename Response>
grpc::Status TrainerService::RunSessionCall(grpc::ServerContext* ctx, const SessionCall<Response>& call,
                                            Response* response) {
  return Handle(call.method, ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    std::shared_ptr<SessionEntry> entry = sessions_.Find(*call.session_id, caller, &status);
    if (entry == nullptr) return status;  // the session's access before anything about the request
    if (call.request_id != nullptr) {
      status = ValidateRequestId(*call.request_id);
      if (!status.ok()) return status;
    }
    // Whether the caller still waits: for its turn, for the step lock, and inside the engine's step.
    tigon::CallContext context;
    context.deadline = ctx->deadline();
    context.cancelled = [ctx] { return ctx->IsCancelled(); };
    SessionSequence::Turn turn;  // held until the call ends, after its step lock
    if (call.order != nullptr) {
      const SessionSequence::Limits limits{context.deadline, context.cancelled, config_.call_order_timeout_seconds};
      status = entry->sequence.WaitForTurn(call.order->stream(), call.order->number(), limits, &turn);
      if (!status.ok()) return status;
    }
    if (call.check) {
      status = call.check(*entry, caller, context);
      if (!status.ok()) return status;
    }
    if (call.lock == Lock::kNone) return call.execute(*entry, context, response);
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(context, *entry, &lock);
    if (!status.ok()) return status;
    if constexpr (std::is_same_v<Response, v1::StepResult>) {
      if (call.request_id != nullptr && Replay(*entry, *call.request_id, call.method, response, &status)) return status;
    }
    status = call.execute(*entry, context, response);
    entry->RefreshInfo();
    if constexpr (std::is_same_v<Response, v1::StepResult>) {
      if (status.ok() && call.request_id != nullptr) entry->request_cache.Insert(*call.request_id, call.method, *response);
    }
    return status;
  });
}

grpc::Status TrainerService::Acquire(const tigon::CallContext& context, SessionEntry& entry,
                                     std::unique_lock<std::timed_mutex>* lock) {
  const auto deadline = context.deadline;
  std::unique_lock<std::timed_mutex> step_lock(entry.step_mu, std::defer_lock);
  if (deadline > std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    step_lock.lock();  // no deadline (or one too far away to matter)
  } else if (!step_lock.try_lock_until(deadline)) {
    return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                 "the deadline passed while the call waited for the previous step of session '" + entry.id +
                     "'; nothing was applied");
  }
  if (entry.closed) {
    return Error(grpc::StatusCode::NOT_FOUND, "session '" + entry.id + "' was closed");
  }
  grpc::Status wanted = ToGrpcStatus(context.Check("before the step started"));
  if (!wanted.ok()) return wanted;
  entry.Touch();
  *lock = std::move(step_lock);
  return grpc::Status::OK;
}

bool TrainerService::Replay(SessionEntry& entry, const std::string& request_id, const char* method,
                            v1::StepResult* response, grpc::Status* status) {
  const RequestCache::Entry* hit = entry.request_cache.Find(request_id);
  if (hit == nullptr) return false;
  if (hit->method != method) {
    *status = Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id '" + ClientText(request_id) + "' was already used by a " +
                                                            hit->method + " call on this session");
  } else {
    *response = hit->result;
    response->set_replayed(true);
    *status = grpc::Status::OK;
  }
  return true;
}

grpc::Status TrainerService::CheckBatch(const SessionEntry& entry, const Caller& caller,
                                        const tigon::CallContext& context, bool has_batch, const v1::Batch& batch,
                                        tigon::Batch* out) {
  if (!has_batch) return Error(grpc::StatusCode::INVALID_ARGUMENT, "the request has no batch");
  const tigon::BatchLimits limits{entry.vocab_size, entry.max_position_embeddings, config_.max_batch_tokens};
  if (batch.reference_session_id().empty()) {
    grpc::Status status = ValidateBatch(batch, limits);
    if (!status.ok()) return status;
    *out = ToEngineBatch(batch);
    return grpc::Status::OK;
  }
  // The reference's log-probabilities stand in for reference_logprobs: the batch is checked as if they
  // had been sent, and only then computed.
  grpc::Status status = ValidateBatchShape(batch.batch(), batch.seq_len(), limits);
  if (!status.ok()) return status;
  if (batch.reference_logprobs_size() > 0) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "give reference_logprobs or reference_session_id, not both");
  }
  tigon::Batch converted = ToEngineBatch(batch);
  converted.reference_logprobs.assign(static_cast<size_t>(batch.batch() * batch.seq_len()), 0.0f);
  status = ToGrpcStatus(tigon::CheckBatch(converted, limits));
  if (!status.ok()) return status;
  status = ValidateSessionId(batch.reference_session_id());
  if (!status.ok()) return status;
  if (batch.reference_session_id() == entry.id) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT, "reference_session_id names the session being trained");
  }
  std::shared_ptr<SessionEntry> reference = sessions_.Find(batch.reference_session_id(), caller, &status);
  if (reference == nullptr) return status;
  if (reference->vocab_size != entry.vocab_size) {
    return Error(grpc::StatusCode::INVALID_ARGUMENT,
                 "reference session '" + reference->id + "' has a vocabulary of " +
                     std::to_string(reference->vocab_size) + " tokens, this session " +
                     std::to_string(entry.vocab_size));
  }
  std::unique_lock<std::timed_mutex> lock;
  status = Acquire(context, *reference, &lock);
  if (!status.ok()) return status;
  // The reference sees the same tokens and targets; its own loss is cross-entropy, whatever this batch's.
  tigon::Batch rows;
  rows.batch = converted.batch;
  rows.seq_len = converted.seq_len;
  rows.input_ids = converted.input_ids;
  rows.labels = converted.labels;
  tigon::ForwardResult result;
  tigon::Status engine_status = reference->session->Forward(rows, context, &result);
  if (!engine_status.ok()) {
    return grpc::Status(ToGrpcStatus(engine_status).error_code(),
                        "the reference session's forward pass failed: " + engine_status.message());
  }
  converted.reference_logprobs = std::move(result.logprobs);
  *out = std::move(converted);
  return grpc::Status::OK;
}

grpc::Status TrainerService::FinishStep(const SessionEntry& entry, const char* method,
                                        const tigon::Status& engine_status, const tigon::StepStats& stats,
                                        v1::StepResult* response) {
  if (!engine_status.ok()) return FromEngine(engine_status, entry);
  ToProto(stats, response);
  if (metrics_ != nullptr) metrics_->RecordStep(entry.id, entry.model_family, method, stats);
  return grpc::Status::OK;
}

grpc::Status TrainerService::FromEngine(const tigon::Status& status, const SessionEntry& entry) {
  if (status.code() == tigon::StatusCode::kResourceExhausted && metrics_ != nullptr) {
    metrics_->RecordOutOfMemory(entry.model_family);
  }
  return ToGrpcStatus(status);
}

// ---- the registry ---------------------------------------------------------------------------------

void TrainerService::CloseEntry(SessionEntry& entry, const std::string& why) {
  entry.Close();
  if (metrics_ != nullptr) metrics_->SessionClosed(entry.id);
  spdlog::info("session {} closed{}", entry.id, why);
}

int TrainerService::CloseIdleSessions() {
  if (config_.session_idle_timeout_seconds <= 0) return 0;
  const int64_t limit_ns = static_cast<int64_t>(config_.session_idle_timeout_seconds * 1e9);
  int closed = 0;
  for (const auto& entry : sessions_.IdleLongerThan(limit_ns)) {
    std::unique_lock<std::timed_mutex> step_lock(entry->step_mu, std::try_to_lock);
    if (!step_lock.owns_lock() || entry->closed) continue;                // in a step: not idle
    if (SteadyNowNs() - entry->last_used_ns.load() <= limit_ns) continue;  // used meanwhile
    sessions_.Remove(entry->id);
    journal_.Closed(entry->id);
    CloseEntry(*entry, fmt::format(" after {:.0f} s without a call (--session-idle-timeout)",
                                   config_.session_idle_timeout_seconds));
    ++closed;
  }
  return closed;
}

void TrainerService::CloseAllSessions() {
  for (auto& [id, entry] : sessions_.TakeAll()) {
    std::lock_guard<std::timed_mutex> step_lock(entry->step_mu);
    CloseEntry(*entry, " at shutdown");
  }
}

int64_t TrainerService::active_sessions() const { return sessions_.size(); }

void TrainerService::BeginDrain() { calls_.BeginDrain(); }

bool TrainerService::WaitForCalls(std::chrono::system_clock::time_point deadline) {
  return calls_.WaitForCalls(deadline);
}

int64_t TrainerService::calls_in_flight() const { return calls_.in_flight(); }

// ---- sessions -------------------------------------------------------------------------------------

grpc::Status TrainerService::CreateSession(grpc::ServerContext* ctx, const v1::CreateSessionRequest* request,
                                           v1::SessionInfo* response) {
  return Handle("CreateSession", ctx, [&](const Caller& caller) -> grpc::Status {
    std::shared_ptr<SessionEntry> entry;
    grpc::Status status = BuildSession(caller, *request, ctx, &entry);
    if (!status.ok()) return status;
    if (entry->world.world_size == 0) {
      journal_.Created({entry->id, caller.name, caller.admin, *request, "", 0});
    }
    ToProto(entry->InfoSnapshot(), entry->id, entry->world, response);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::BuildSession(const Caller& caller, const v1::CreateSessionRequest& request,
                                          grpc::ServerContext* ctx, std::shared_ptr<SessionEntry>* entry_out) {
  tigon::SessionOptions options;
  const int device_count = static_cast<int>(engine_.list_devices().size());
  ModelFolder folder;  // what a model_path names, resolved inside the model roots (model_roots.h)
  grpc::Status status = ResolveModelFolder(config_.model_roots, checkpoints_, caller, request, &folder);
  if (status.ok()) status = ValidateCreateSession(request, engine_.model_families, device_count, &options,
                                                  config_.max_parameters, &folder);
  if (!status.ok()) return status;
  WorldRank world;
  status = ValidateWorldRank(request, device_count, &world);
  if (!status.ok()) return status;
  if (world.world_size > 0 && options.devices.empty()) options.devices = {0};
  SessionRegistry::Slot slot;
  status = sessions_.Reserve(&slot);
  if (!status.ok()) return status;
  if (ctx != nullptr && std::chrono::system_clock::now() >= ctx->deadline()) {
    return Error(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed before the session was created");
  }
  const auto start = Clock::now();
  std::unique_ptr<tigon::Session> session;
  // A rank of a session over several servers returns once every rank has joined.
  tigon::Status engine_status = world.world_size > 0 ? engine_.create_world_session(options, world, &session)
                                                     : engine_.create_session(options, &session);
  if (!engine_status.ok()) {
    if (engine_status.code() == tigon::StatusCode::kResourceExhausted && metrics_ != nullptr) {
      metrics_->RecordOutOfMemory("unknown");
    }
    return HideModelFolder(ToGrpcStatus(engine_status), folder);
  }
  if (session == nullptr) return Error(grpc::StatusCode::INTERNAL, "the engine created no session");
  // A caller that gave up while the model was built would never learn the session's id: drop it
  // rather than leak a session (and its device memory) until shutdown.
  if (ctx != nullptr && ctx->IsCancelled()) {
    spdlog::info("CreateSession: the caller left after {:.2f} s; the new session is dropped", SecondsSince(start));
    return std::chrono::system_clock::now() >= ctx->deadline()
               ? Error(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed while the session was created")
               : Error(grpc::StatusCode::CANCELLED, "the call was cancelled while the session was created");
  }
  auto entry = *entry_out != nullptr ? *entry_out : std::make_shared<SessionEntry>();
  entry->owner = caller.name;
  entry->session = std::move(session);
  entry->RefreshInfo();
  entry->vocab_size = entry->info.vocab_size;
  entry->max_position_embeddings = entry->info.max_position_embeddings;
  entry->model_family = entry->info.model_family;
  entry->options = options;
  entry->world = world;
  if (!sessions_.Add(entry)) {
    return Error(grpc::StatusCode::ALREADY_EXISTS, "session '" + entry->id + "' exists already");
  }
  if (metrics_ != nullptr) metrics_->SessionOpened(entry->id, entry->info);
  spdlog::info("session {} created: {} {} kernels={} parameters={} in {:.2f} s", entry->id, entry->info.model_family,
               entry->info.precision, options.kernels, entry->info.parameter_count, SecondsSince(start));
  *entry_out = entry;
  return grpc::Status::OK;
}

grpc::Status TrainerService::GetSession(grpc::ServerContext* ctx, const v1::GetSessionRequest* request,
                                        v1::SessionInfo* response) {
  SessionCall<v1::SessionInfo> call{"GetSession", &request->session_id(), Lock::kNone};
  call.execute = [&](SessionEntry& entry, const tigon::CallContext&, v1::SessionInfo* out) {
    entry.Touch();
    ToProto(entry.InfoSnapshot(), entry.id, entry.world, out);
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

grpc::Status TrainerService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                          v1::ListSessionsResponse* response) {
  return Handle("ListSessions", ctx, [&](const Caller& caller) -> grpc::Status {
    for (const auto& entry : sessions_.VisibleTo(caller)) ToProto(entry->InfoSnapshot(), entry->id, entry->world, response->add_sessions());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* request,
                                          v1::CloseSessionResponse* response) {
  SessionCall<v1::CloseSessionResponse> call{"CloseSession", &request->session_id(), Lock::kNone};
  call.order = &request->order();
  call.execute = [&](SessionEntry& entry, const tigon::CallContext&, v1::CloseSessionResponse*) {
    if (!sessions_.Remove(entry.id)) {
      return Error(grpc::StatusCode::NOT_FOUND, "session '" + entry.id + "' was closed");
    }
    // Waits for a running step: the engine session is destroyed only between steps.
    std::lock_guard<std::timed_mutex> step_lock(entry.step_mu);
    journal_.Closed(entry.id);
    CloseEntry(entry, "");
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

// ---- steps ----------------------------------------------------------------------------------------

grpc::Status TrainerService::ForwardBackward(grpc::ServerContext* ctx, const v1::ForwardBackwardRequest* request,
                                             v1::StepResult* response) {
  tigon::Batch batch;
  SessionCall<v1::StepResult> call{"ForwardBackward", &request->session_id()};
  call.order = &request->order();
  call.check = [&](const SessionEntry& entry, const Caller& caller, const tigon::CallContext& context) {
    return CheckBatch(entry, caller, context, request->has_batch(), request->batch(), &batch);
  };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext& context, v1::StepResult* out) {
    tigon::StepStats stats;
    tigon::Status engine_status = entry.session->ForwardBackward(batch, context, &stats);
    spdlog::debug("session {} ForwardBackward loss={:.5f} tokens={} pending={}", entry.id, stats.loss, stats.tokens,
                  stats.accumulated_batches);
    return FinishStep(entry, "ForwardBackward", engine_status, stats, out);
  };
  return RunSessionCall(ctx, call, response);
}

grpc::Status TrainerService::OptimStep(grpc::ServerContext* ctx, const v1::OptimStepRequest* request,
                                       v1::StepResult* response) {
  SessionCall<v1::StepResult> call{"OptimStep", &request->session_id()};
  call.order = &request->order();
  call.request_id = &request->request_id();
  call.check = [&](const SessionEntry&, const Caller&, const tigon::CallContext&) { return ValidateOptimizerSettings(request->optimizer()); };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext& context, v1::StepResult* out) {
    if (entry.InfoSnapshot().accumulated_batches == 0) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   "no accumulated gradients: call ForwardBackward before OptimStep");
    }
    tigon::StepStats stats;
    tigon::Status engine_status = entry.session->OptimStep(ToEngineOverrides(request->optimizer()), context, &stats);
    spdlog::debug("session {} OptimStep step={} grad_norm={:.5f} lr={}", entry.id, stats.step, stats.grad_norm,
                  stats.lr);
    return FinishStep(entry, "OptimStep", engine_status, stats, out);
  };
  return RunSessionCall(ctx, call, response);
}

grpc::Status TrainerService::TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* request,
                                       v1::StepResult* response) {
  tigon::Batch batch;
  SessionCall<v1::StepResult> call{"TrainStep", &request->session_id()};
  call.order = &request->order();
  call.request_id = &request->request_id();
  call.check = [&](const SessionEntry& entry, const Caller& caller, const tigon::CallContext& context) {
    grpc::Status status = CheckBatch(entry, caller, context, request->has_batch(), request->batch(), &batch);
    return status.ok() ? ValidateOptimizerSettings(request->optimizer()) : status;
  };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext& context, v1::StepResult* out) {
    tigon::StepStats stats;
    // Gradients pending from earlier ForwardBackward calls join this step; the engine stops it before the
    // update when the caller gave up during the forward and backward pass (tigon::CallContext).
    tigon::Status engine_status =
        entry.session->TrainStep(batch, ToEngineOverrides(request->optimizer()), context, &stats);
    spdlog::debug("session {} TrainStep step={} loss={:.5f} tokens={} {:.0f} tokens/s", entry.id, stats.step,
                  stats.loss, stats.tokens, stats.tokens_per_second);
    return FinishStep(entry, "TrainStep", engine_status, stats, out);
  };
  return RunSessionCall(ctx, call, response);
}

grpc::Status TrainerService::Forward(grpc::ServerContext* ctx, const v1::ForwardRequest* request,
                                     v1::ForwardResponse* response) {
  tigon::Batch batch;
  SessionCall<v1::ForwardResponse> call{"Forward", &request->session_id()};
  call.order = &request->order();
  call.check = [&](const SessionEntry& entry, const Caller& caller, const tigon::CallContext& context) {
    return CheckBatch(entry, caller, context, request->has_batch(), request->batch(), &batch);
  };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext& context, v1::ForwardResponse* out) {
    const auto start = Clock::now();
    tigon::ForwardResult result;
    tigon::Status engine_status = entry.session->Forward(batch, context, &result);
    const double seconds = SecondsSince(start);
    if (!engine_status.ok()) return FromEngine(engine_status, entry);
    out->set_loss(result.loss);
    out->set_tokens(result.tokens);
    out->set_wall_seconds(seconds);
    if (request->return_logprobs()) out->mutable_logprobs()->Assign(result.logprobs.begin(), result.logprobs.end());
    for (const auto& [name, value] : result.metrics) (*out->mutable_metrics())[name] = value;
    if (metrics_ != nullptr) metrics_->RecordForward(entry.id, entry.model_family, result.tokens, seconds);
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

// ---- checkpoints ----------------------------------------------------------------------------------

grpc::Status TrainerService::SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  CheckpointSaveTarget target;  // the checkpoint's parent folder, held open until the save is done
  SessionCall<v1::CheckpointResponse> call{"SaveCheckpoint", &request->session_id()};
  call.order = &request->order();
  call.check = [&](const SessionEntry&, const Caller& caller, const tigon::CallContext&) {
    return checkpoints_.OpenForSave(request->path(), caller, &target);
  };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext&, v1::CheckpointResponse* out) {
    const auto start = Clock::now();
    tigon::Status engine_status =
        entry.session->SaveCheckpointAt(target.parent.get(), target.name, "'" + ClientText(target.relative) + "'");
    if (!engine_status.ok()) return FromEngine(engine_status, entry);
    grpc::Status status = checkpoints_.CheckStillInPlace(target);
    if (!status.ok()) return status;
    out->set_path(target.relative);
    out->set_wall_seconds(SecondsSince(start));
    out->set_step(entry.session->Info().step);
    journal_.Checkpointed(entry.id, RootRelative(target.location), out->step());
    spdlog::info("session {} saved checkpoint '{}' at step {}", entry.id, ClientText(target.relative), out->step());
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

grpc::Status TrainerService::LoadCheckpoint(grpc::ServerContext* ctx, const v1::LoadCheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  CheckpointLoadTarget target;  // the checkpoint's folder, held open until the load is done
  SessionCall<v1::CheckpointResponse> call{"LoadCheckpoint", &request->session_id()};
  call.order = &request->order();
  call.check = [&](const SessionEntry&, const Caller& caller, const tigon::CallContext&) {
    return checkpoints_.OpenForLoad(request->path(), caller, &target);
  };
  call.execute = [&](SessionEntry& entry, const tigon::CallContext&, v1::CheckpointResponse* out) {
    const auto start = Clock::now();
    tigon::Status engine_status =
        entry.session->LoadCheckpointAt(target.folder.get(), "'" + ClientText(target.relative) + "'");
    if (!engine_status.ok()) return FromEngine(engine_status, entry);
    // Results remembered from before the load describe a state the session no longer has.
    entry.request_cache.Clear();
    out->set_path(target.relative);
    out->set_wall_seconds(SecondsSince(start));
    out->set_step(entry.session->Info().step);
    journal_.Checkpointed(entry.id, RootRelative(target.location), out->step());
    spdlog::info("session {} loaded checkpoint '{}' (step {})", entry.id, ClientText(target.relative), out->step());
    return grpc::Status::OK;
  };
  return RunSessionCall(ctx, call, response);
}

// ---- server ---------------------------------------------------------------------------------------

grpc::Status TrainerService::NewCommunicatorId(grpc::ServerContext* ctx, const v1::NewCommunicatorIdRequest*,
                                               v1::NewCommunicatorIdResponse* response) {
  return Handle("NewCommunicatorId", ctx, [&](const Caller&) -> grpc::Status {
    std::string id;
    const tigon::Status status = engine_.new_communicator_id ? engine_.new_communicator_id(&id)
                                                             : tigon::Status(tigon::StatusCode::kInvalidArgument,
                                                                             "this engine has no communicator");
    // The request has no arguments: a refusal is about the server (no NCCL in its build).
    if (status.code() == tigon::StatusCode::kInvalidArgument) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION, status.message());
    }
    if (!status.ok()) return ToGrpcStatus(status);
    response->set_communicator_id(id);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest*,
                                           v1::ServerInfo* response) {
  return Handle("GetServerInfo", ctx, [&](const Caller&) -> grpc::Status {
    response->set_version(config_.version);
    response->set_engine_version(engine_.engine_version);
    for (const auto& family : engine_.model_families) response->add_model_families(family);
    for (const auto& device : engine_.list_devices()) {
      auto* out = response->add_devices();
      out->set_index(device.index);
      out->set_name(device.name);
      out->set_total_bytes(device.total_bytes);
      out->set_free_bytes(device.free_bytes);
    }
    auto* limits = response->mutable_limits();
    limits->set_max_sessions(config_.max_sessions);
    limits->set_max_batch_tokens(config_.max_batch_tokens);
    limits->set_max_message_bytes(config_.max_message_bytes);
    response->set_auth_required(auth_.enabled());
    response->set_checkpoints_enabled(checkpoints_.enabled());
    response->set_active_sessions(active_sessions());
    response->set_uptime_seconds(SecondsSince(started_));
    return grpc::Status::OK;
  });
}

// MeasureSavings runs through RunSessionCall from its own file (measure_savings.cpp).
template grpc::Status TrainerService::RunSessionCall(grpc::ServerContext*,
                                                     const SessionCall<v1::MeasureSavingsResponse>&,
                                                     v1::MeasureSavingsResponse*);

}  // namespace tigon::server
