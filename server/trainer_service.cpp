#include "server/trainer_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <system_error>

#include "server/status_map.h"
#include "server/validation.h"

namespace tigon::server {
namespace {

using Clock = std::chrono::steady_clock;

grpc::Status Error(grpc::StatusCode code, const std::string& message) { return grpc::Status(code, message); }

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void ToProto(const tigon::StepStats& stats, v1::StepResult* out) {
  out->set_step(stats.step);
  out->set_loss(stats.loss);
  out->set_tokens(stats.tokens);
  out->set_grad_norm(stats.grad_norm);
  out->set_lr(stats.lr);
  out->set_wall_seconds(stats.wall_seconds);
  out->set_tokens_per_second(stats.tokens_per_second);
  out->set_peak_allocated_bytes(stats.peak_allocated_bytes);
  out->set_peak_reserved_bytes(stats.peak_reserved_bytes);
  out->set_accumulated_batches(stats.accumulated_batches);
}

// A TrainStep's statistics from its ForwardBackward (`stats`) and OptimStep (`optim`) parts, as the
// engine's TrainStep reports them.
void MergeTrainStepStats(const tigon::StepStats& optim, tigon::StepStats* stats) {
  stats->step = optim.step;
  stats->grad_norm = optim.grad_norm;
  stats->lr = optim.lr;
  stats->accumulated_batches = 0;
  stats->wall_seconds += optim.wall_seconds;
  stats->tokens_per_second = stats->wall_seconds > 0 ? stats->tokens / stats->wall_seconds : 0.0;
  stats->peak_allocated_bytes = std::max(stats->peak_allocated_bytes, optim.peak_allocated_bytes);
  stats->peak_reserved_bytes = std::max(stats->peak_reserved_bytes, optim.peak_reserved_bytes);
}

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
      id_rng_(std::random_device{}()) {
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

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
}  // namespace

int TrainerService::CloseIdleSessions() {
  if (config_.session_idle_timeout_seconds <= 0) return 0;
  const int64_t limit_ns = static_cast<int64_t>(config_.session_idle_timeout_seconds * 1e9);
  std::vector<std::shared_ptr<SessionEntry>> candidates;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (const auto& [id, entry] : sessions_) {
      if (NowNs() - entry->last_used_ns.load() > limit_ns) candidates.push_back(entry);
    }
  }
  int closed = 0;
  for (const auto& entry : candidates) {
    std::unique_lock<std::timed_mutex> step_lock(entry->step_mu, std::try_to_lock);
    if (!step_lock.owns_lock() || entry->closed) continue;           // in a step: not idle
    if (NowNs() - entry->last_used_ns.load() <= limit_ns) continue;  // used meanwhile
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      sessions_.erase(entry->id);
    }
    entry->closed = true;
    entry->session.reset();
    if (metrics_ != nullptr) metrics_->SessionClosed(entry->id);
    spdlog::info("session {} closed after {:.0f} s without a call (--session-idle-timeout)", entry->id,
                 config_.session_idle_timeout_seconds);
    ++closed;
  }
  return closed;
}

grpc::Status TrainerService::Handle(const char* method, grpc::ServerContext* ctx,
                                    const std::function<grpc::Status(const Caller&)>& body) {
  const auto start = Clock::now();
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    if (draining_) {
      status = Error(grpc::StatusCode::UNAVAILABLE, "the server is shutting down and takes no new calls");
    } else {
      ++calls_in_flight_;
    }
  }
  const bool admitted = status.ok();
  ScopeExit done([this, admitted] {
    if (!admitted) return;
    std::lock_guard<std::mutex> lock(calls_mu_);
    if (--calls_in_flight_ == 0) calls_done_.notify_all();
  });
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

std::shared_ptr<TrainerService::SessionEntry> TrainerService::Find(const std::string& session_id,
                                                                   const Caller& caller, grpc::Status* status) const {
  if (session_id.empty()) {
    *status = Error(grpc::StatusCode::INVALID_ARGUMENT, "session_id is empty");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(sessions_mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    *status = Error(grpc::StatusCode::NOT_FOUND, "no session '" + session_id + "' on this server");
    return nullptr;
  }
  if (!MayUseSession(caller, it->second->owner)) {
    *status = Error(grpc::StatusCode::PERMISSION_DENIED,
                    "session '" + session_id + "' belongs to another client; its calls need the token of the "
                    "client that created it or an admin token");
    return nullptr;
  }
  return it->second;
}

void TrainerService::BeginDrain() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  draining_ = true;
}

bool TrainerService::WaitForCalls(std::chrono::system_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(calls_mu_);
  return calls_done_.wait_until(lock, deadline, [this] { return calls_in_flight_ == 0; });
}

int64_t TrainerService::calls_in_flight() const {
  std::lock_guard<std::mutex> lock(calls_mu_);
  return calls_in_flight_;
}

grpc::Status TrainerService::AbandonIfUnwanted(grpc::ServerContext* ctx, SessionEntry* entry, const char* method) {
  const bool late = std::chrono::system_clock::now() >= ctx->deadline();
  if (!late && !ctx->IsCancelled()) return grpc::Status::OK;
  if (entry->world.world_size > 0) {
    // A rank's gradients are already summed with the other ranks', which go on to apply them: dropping
    // them here alone would leave this rank's weights different from theirs. The step finishes and is
    // remembered under its request_id, so a retry gets its result.
    spdlog::warn("session {} {}: the caller gave up, but a rank of a multi-server session finishes the step its "
                 "peers finish", entry->id, method);
    return grpc::Status::OK;
  }
  tigon::Status dropped = entry->session->DiscardGradients();
  RefreshInfo(entry);
  if (!dropped.ok()) {
    // The gradients stay: finishing the step keeps the session consistent, and a retry with the same
    // request_id gets its result.
    spdlog::warn("session {} {}: the caller gave up, but the step goes on: {}", entry->id, method, dropped.message());
    return grpc::Status::OK;
  }
  spdlog::info("session {} {}: the caller gave up during the backward pass; its gradients were dropped, no "
               "update applied", entry->id, method);
  return late ? Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "the deadline passed during the forward and backward pass; the step was not applied")
              : Error(grpc::StatusCode::CANCELLED,
                      "the call was cancelled during the forward and backward pass; the step was not applied");
}

grpc::Status TrainerService::Acquire(grpc::ServerContext* ctx, const std::string& session_id, const Caller& caller,
                                     std::shared_ptr<SessionEntry>* entry, std::unique_lock<std::timed_mutex>* lock) {
  grpc::Status status;
  *entry = Find(session_id, caller, &status);
  if (*entry == nullptr) return status;
  const auto deadline = ctx->deadline();
  std::unique_lock<std::timed_mutex> step_lock((*entry)->step_mu, std::defer_lock);
  if (deadline > std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    step_lock.lock();  // no deadline (or one too far away to matter)
  } else if (!step_lock.try_lock_until(deadline)) {
    return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                 "the deadline passed while the call waited for the previous step of session '" + session_id +
                     "'; nothing was applied");
  }
  if ((*entry)->closed) {
    return Error(grpc::StatusCode::NOT_FOUND, "session '" + session_id + "' was closed");
  }
  if (std::chrono::system_clock::now() >= deadline) {
    return Error(grpc::StatusCode::DEADLINE_EXCEEDED,
                 "the deadline passed before the step started; nothing was applied");
  }
  if (ctx->IsCancelled()) {
    return Error(grpc::StatusCode::CANCELLED, "the call was cancelled before the step started; nothing was applied");
  }
  (*entry)->last_used_ns = NowNs();
  *lock = std::move(step_lock);
  return grpc::Status::OK;
}

int64_t TrainerService::PendingBatches(const SessionEntry& entry) {
  std::lock_guard<std::mutex> lock(entry.info_mu);
  return entry.info.accumulated_batches;
}

void TrainerService::RefreshInfo(SessionEntry* entry) {
  entry->last_used_ns = NowNs();  // idle time counts from the end of the last call
  tigon::SessionInfo info = entry->session->Info();
  std::lock_guard<std::mutex> lock(entry->info_mu);
  entry->info = std::move(info);
}

grpc::Status TrainerService::FromEngine(const tigon::Status& status, const SessionEntry& entry) {
  if (status.code() == tigon::StatusCode::kResourceExhausted && metrics_ != nullptr) {
    metrics_->RecordOutOfMemory(entry.model_family);
  }
  return ToGrpcStatus(status);
}

void TrainerService::ToProto(const SessionEntry& entry, v1::SessionInfo* out) const {
  tigon::SessionInfo info;
  {
    std::lock_guard<std::mutex> lock(entry.info_mu);
    info = entry.info;
  }
  out->set_session_id(entry.id);
  out->set_model_family(info.model_family);
  out->set_precision(info.precision);
  out->set_parameter_count(info.parameter_count);
  out->set_vocab_size(info.vocab_size);
  out->set_max_position_embeddings(info.max_position_embeddings);
  for (const auto& op : info.ops) {
    auto* selection = out->add_ops();
    selection->set_op(op.op);
    selection->set_choice(op.choice);
    if (op.choice == "fused") out->add_fused_ops(op.op);
  }
  for (int device : info.devices) out->add_devices(device);
  out->set_step(info.step);
  out->set_accumulated_batches(info.accumulated_batches);
  auto* optimizer = out->mutable_optimizer();
  optimizer->set_lr(info.optimizer.lr);
  optimizer->set_beta1(info.optimizer.beta1);
  optimizer->set_beta2(info.optimizer.beta2);
  optimizer->set_eps(info.optimizer.eps);
  optimizer->set_weight_decay(info.optimizer.weight_decay);
  optimizer->set_max_grad_norm(info.optimizer.max_grad_norm);
  out->set_seed(info.seed);
  out->set_optimizer_in_backward(info.optimizer_in_backward);
  out->set_world_size(entry.world.world_size);
  out->set_rank(entry.world.rank);
}

std::string TrainerService::NewSessionId() {
  for (;;) {
    std::ostringstream out;
    out << "s-" << std::hex << std::setw(16) << std::setfill('0') << id_rng_();
    if (sessions_.count(out.str()) == 0) return out.str();
  }
}

int64_t TrainerService::active_sessions() const {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  return static_cast<int64_t>(sessions_.size());
}

void TrainerService::CloseAllSessions() {
  std::map<std::string, std::shared_ptr<SessionEntry>> sessions;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, entry] : sessions) {
    std::lock_guard<std::timed_mutex> step_lock(entry->step_mu);
    entry->closed = true;
    entry->session.reset();
    if (metrics_ != nullptr) metrics_->SessionClosed(id);
    spdlog::info("session {} closed at shutdown", id);
  }
}

grpc::Status TrainerService::ReserveSessionSlot() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  const int64_t in_use = static_cast<int64_t>(sessions_.size()) + sessions_being_created_;
  if (in_use >= config_.max_sessions) {
    return Error(grpc::StatusCode::RESOURCE_EXHAUSTED,
                 "server limit: " + std::to_string(in_use) +
                     " sessions are open or being created, the most this server allows "
                     "(--max-sessions=" +
                     std::to_string(config_.max_sessions) + "); close a session first");
  }
  ++sessions_being_created_;
  return grpc::Status::OK;
}

void TrainerService::ReleaseSessionSlot() {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  --sessions_being_created_;
}

// ---- sessions -------------------------------------------------------------------------------------

grpc::Status TrainerService::CreateSession(grpc::ServerContext* ctx, const v1::CreateSessionRequest* request,
                                           v1::SessionInfo* response) {
  return Handle("CreateSession", ctx, [&](const Caller& caller) -> grpc::Status {
    tigon::SessionOptions options;
    const int device_count = static_cast<int>(engine_.list_devices().size());
    grpc::Status status =
        ValidateCreateSession(*request, engine_.model_families, device_count, &options, config_.max_parameters);
    if (!status.ok()) return status;
    WorldRank world;
    status = ValidateWorldRank(*request, device_count, &world);
    if (!status.ok()) return status;
    if (world.world_size > 0 && options.devices.empty()) options.devices = {0};
    status = ReserveSessionSlot();
    if (!status.ok()) return status;
    ScopeExit release([this] { ReleaseSessionSlot(); });
    if (std::chrono::system_clock::now() >= ctx->deadline()) {
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
      return ToGrpcStatus(engine_status);
    }
    if (session == nullptr) {
      return Error(grpc::StatusCode::INTERNAL, "the engine created no session");
    }
    // A caller that gave up while the model was built would never learn the session's id: drop it
    // rather than leak a session (and its device memory) until shutdown.
    if (ctx->IsCancelled()) {
      spdlog::info("CreateSession: the caller left after {:.2f} s; the new session is dropped", SecondsSince(start));
      return std::chrono::system_clock::now() >= ctx->deadline()
                 ? Error(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed while the session was created")
                 : Error(grpc::StatusCode::CANCELLED, "the call was cancelled while the session was created");
    }
    auto entry = std::make_shared<SessionEntry>();
    entry->owner = caller.name;
    entry->session = std::move(session);
    RefreshInfo(entry.get());
    entry->vocab_size = entry->info.vocab_size;
    entry->max_position_embeddings = entry->info.max_position_embeddings;
    entry->model_family = entry->info.model_family;
    entry->options = options;
    entry->world = world;
    entry->last_used_ns = NowNs();
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      entry->id = NewSessionId();
      sessions_[entry->id] = entry;
    }
    if (metrics_ != nullptr) metrics_->SessionOpened(entry->id, entry->info);
    spdlog::info("session {} created: {} {} kernels={} parameters={} in {:.2f} s", entry->id, entry->info.model_family,
                 entry->info.precision, options.kernels, entry->info.parameter_count, SecondsSince(start));
    ToProto(*entry, response);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::GetSession(grpc::ServerContext* ctx, const v1::GetSessionRequest* request,
                                        v1::SessionInfo* response) {
  return Handle("GetSession", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    auto entry = Find(request->session_id(), caller, &status);
    if (entry == nullptr) return status;
    entry->last_used_ns = NowNs();
    ToProto(*entry, response);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                          v1::ListSessionsResponse* response) {
  return Handle("ListSessions", ctx, [&](const Caller& caller) -> grpc::Status {
    std::vector<std::shared_ptr<SessionEntry>> entries;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (const auto& [id, entry] : sessions_) {
        if (MayUseSession(caller, entry->owner)) entries.push_back(entry);  // a user sees only its own
      }
    }
    for (const auto& entry : entries) ToProto(*entry, response->add_sessions());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* request,
                                          v1::CloseSessionResponse*) {
  return Handle("CloseSession", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    auto entry = Find(request->session_id(), caller, &status);
    if (entry == nullptr) return status;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      if (sessions_.erase(request->session_id()) == 0) {
        return Error(grpc::StatusCode::NOT_FOUND, "session '" + request->session_id() + "' was closed");
      }
    }
    // Waits for a running step: the engine session is destroyed only between steps.
    std::lock_guard<std::timed_mutex> step_lock(entry->step_mu);
    entry->closed = true;
    entry->session.reset();
    if (metrics_ != nullptr) metrics_->SessionClosed(entry->id);
    spdlog::info("session {} closed", entry->id);
    return grpc::Status::OK;
  });
}

// ---- steps ----------------------------------------------------------------------------------------

grpc::Status TrainerService::PrepareBatch(const std::string& session_id, const Caller& caller, bool has_batch,
                                          const v1::Batch& batch, tigon::Batch* out) const {
  grpc::Status status;
  auto found = Find(session_id, caller, &status);
  if (found == nullptr) return status;
  if (!has_batch) return Error(grpc::StatusCode::INVALID_ARGUMENT, "the request has no batch");
  status = ValidateBatch(batch, {found->vocab_size, found->max_position_embeddings, config_.max_batch_tokens});
  if (!status.ok()) return status;
  *out = ToEngineBatch(batch);
  return grpc::Status::OK;
}

bool TrainerService::Replay(SessionEntry& entry, const std::string& request_id, const char* method,
                            v1::StepResult* response, grpc::Status* status) const {
  const RequestCache::Entry* hit = entry.request_cache.Find(request_id);
  if (hit == nullptr) return false;
  if (hit->method != method) {
    *status = Error(grpc::StatusCode::INVALID_ARGUMENT, "request_id '" + request_id + "' was already used by a " +
                                                            hit->method + " call on this session");
  } else {
    *response = hit->result;
    response->set_replayed(true);
    *status = grpc::Status::OK;
  }
  return true;
}

grpc::Status TrainerService::FinishStep(SessionEntry* entry, const char* method, const tigon::Status& engine_status,
                                        const tigon::StepStats& stats, const std::string* request_id,
                                        v1::StepResult* response) {
  RefreshInfo(entry);
  if (!engine_status.ok()) return FromEngine(engine_status, *entry);
  tigon::server::ToProto(stats, response);
  if (request_id != nullptr) entry->request_cache.Insert(*request_id, method, *response);
  if (metrics_ != nullptr) metrics_->RecordStep(entry->id, entry->model_family, method, stats);
  return grpc::Status::OK;
}

grpc::Status TrainerService::ForwardBackward(grpc::ServerContext* ctx, const v1::ForwardBackwardRequest* request,
                                             v1::StepResult* response) {
  return Handle("ForwardBackward", ctx, [&](const Caller& caller) -> grpc::Status {
    tigon::Batch batch;
    grpc::Status status = PrepareBatch(request->session_id(), caller, request->has_batch(), request->batch(), &batch);
    if (!status.ok()) return status;

    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    const bool first_of_step = PendingBatches(*entry) == 0;
    tigon::StepStats stats;
    tigon::Status engine_status = entry->session->ForwardBackward(batch, &stats);
    // Gradients added to earlier pending ones cannot be taken back alone; the first ones can.
    if (engine_status.ok() && first_of_step) {
      status = AbandonIfUnwanted(ctx, entry.get(), "ForwardBackward");
      if (!status.ok()) return status;
    }
    status = FinishStep(entry.get(), "ForwardBackward", engine_status, stats, nullptr, response);
    if (!status.ok()) return status;
    spdlog::debug("session {} ForwardBackward loss={:.5f} tokens={} pending={}", entry->id, stats.loss, stats.tokens,
                  stats.accumulated_batches);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::OptimStep(grpc::ServerContext* ctx, const v1::OptimStepRequest* request,
                                       v1::StepResult* response) {
  return Handle("OptimStep", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    if (Find(request->session_id(), caller, &status) == nullptr) return status;  // the session's access first
    status = ValidateOptimizerSettings(request->optimizer());
    if (!status.ok()) return status;
    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    const std::string& request_id = request->request_id();
    if (Replay(*entry, request_id, "OptimStep", response, &status)) return status;
    {
      std::lock_guard<std::mutex> info_lock(entry->info_mu);
      if (entry->info.accumulated_batches == 0) {
        return Error(grpc::StatusCode::FAILED_PRECONDITION,
                     "no accumulated gradients: call ForwardBackward before OptimStep");
      }
    }
    tigon::StepStats stats;
    tigon::Status engine_status = entry->session->OptimStep(ToEngineOverrides(request->optimizer()), &stats);
    status = FinishStep(entry.get(), "OptimStep", engine_status, stats, &request_id, response);
    if (!status.ok()) return status;
    spdlog::debug("session {} OptimStep step={} grad_norm={:.5f} lr={}", entry->id, stats.step, stats.grad_norm,
                  stats.lr);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* request,
                                       v1::StepResult* response) {
  return Handle("TrainStep", ctx, [&](const Caller& caller) -> grpc::Status {
    tigon::Batch batch;
    grpc::Status status = PrepareBatch(request->session_id(), caller, request->has_batch(), request->batch(), &batch);
    if (!status.ok()) return status;
    status = ValidateOptimizerSettings(request->optimizer());
    if (!status.ok()) return status;

    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    const std::string& request_id = request->request_id();
    if (Replay(*entry, request_id, "TrainStep", response, &status)) return status;
    tigon::StepStats stats;
    tigon::Status engine_status;
    bool in_backward = false;
    {
      std::lock_guard<std::mutex> info_lock(entry->info_mu);
      in_backward = entry->info.optimizer_in_backward;
    }
    if (PendingBatches(*entry) == 0 && !in_backward) {
      // Two engine calls instead of one, so that a call whose deadline passed during the (long) forward
      // and backward pass is not applied: its gradients are dropped before the optimizer update.
      // (With optimizer_in_backward the update happens inside backward: one engine call.)
      tigon::StepStats optim;
      engine_status = entry->session->ForwardBackward(batch, &stats);
      if (engine_status.ok()) {
        status = AbandonIfUnwanted(ctx, entry.get(), "TrainStep");
        if (!status.ok()) return status;
        engine_status = entry->session->OptimStep(ToEngineOverrides(request->optimizer()), &optim);
        if (!engine_status.ok() && entry->session->Info().accumulated_batches > 0) {
          entry->session->DiscardGradients();  // "on failure nothing is applied", as in the engine's TrainStep
        }
      }
      if (engine_status.ok()) MergeTrainStepStats(optim, &stats);
    } else {
      // Gradients from earlier ForwardBackward calls join this step (the engine's TrainStep semantics).
      engine_status = entry->session->TrainStep(batch, ToEngineOverrides(request->optimizer()), &stats);
    }
    status = FinishStep(entry.get(), "TrainStep", engine_status, stats, &request_id, response);
    if (!status.ok()) return status;
    spdlog::debug("session {} TrainStep step={} loss={:.5f} tokens={} {:.0f} tokens/s", entry->id, stats.step,
                  stats.loss, stats.tokens, stats.tokens_per_second);
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::Forward(grpc::ServerContext* ctx, const v1::ForwardRequest* request,
                                     v1::ForwardResponse* response) {
  return Handle("Forward", ctx, [&](const Caller& caller) -> grpc::Status {
    tigon::Batch batch;
    grpc::Status status = PrepareBatch(request->session_id(), caller, request->has_batch(), request->batch(), &batch);
    if (!status.ok()) return status;

    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    const auto start = Clock::now();
    tigon::ForwardResult result;
    tigon::Status engine_status = entry->session->Forward(batch, &result);
    const double seconds = SecondsSince(start);
    entry->last_used_ns = NowNs();
    if (!engine_status.ok()) return FromEngine(engine_status, *entry);
    response->set_loss(result.loss);
    response->set_tokens(result.tokens);
    response->set_wall_seconds(seconds);
    if (request->return_logprobs()) {
      response->mutable_logprobs()->Assign(result.logprobs.begin(), result.logprobs.end());
    }
    if (metrics_ != nullptr) metrics_->RecordForward(entry->id, entry->model_family, result.tokens, seconds);
    return grpc::Status::OK;
  });
}

// ---- checkpoints ----------------------------------------------------------------------------------

grpc::Status TrainerService::SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  return Handle("SaveCheckpoint", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    if (Find(request->session_id(), caller, &status) == nullptr) return status;  // the session's access first
    std::string absolute, relative;
    status = checkpoints_.Resolve(request->path(), &absolute, &relative);
    if (!status.ok()) return status;
    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(absolute).parent_path(), ec);
    if (ec) {
      return Error(grpc::StatusCode::INTERNAL,
                   "cannot create the folder for checkpoint '" + relative + "': " + ec.message());
    }
    const auto start = Clock::now();
    tigon::Status engine_status = entry->session->SaveCheckpoint(absolute);
    RefreshInfo(entry.get());
    if (!engine_status.ok()) return FromEngine(engine_status, *entry);
    response->set_path(relative);
    response->set_wall_seconds(SecondsSince(start));
    {
      std::lock_guard<std::mutex> info_lock(entry->info_mu);
      response->set_step(entry->info.step);
    }
    spdlog::info("session {} saved checkpoint '{}' at step {}", entry->id, relative, response->step());
    return grpc::Status::OK;
  });
}

grpc::Status TrainerService::LoadCheckpoint(grpc::ServerContext* ctx, const v1::LoadCheckpointRequest* request,
                                            v1::CheckpointResponse* response) {
  return Handle("LoadCheckpoint", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    if (Find(request->session_id(), caller, &status) == nullptr) return status;  // the session's access first
    std::string absolute, relative;
    status = checkpoints_.Resolve(request->path(), &absolute, &relative);
    if (!status.ok()) return status;
    std::error_code ec;
    if (!std::filesystem::is_directory(absolute, ec)) {
      return Error(grpc::StatusCode::NOT_FOUND, "no checkpoint '" + relative + "' under the server's checkpoint root");
    }
    std::shared_ptr<SessionEntry> entry;
    std::unique_lock<std::timed_mutex> lock;
    status = Acquire(ctx, request->session_id(), caller, &entry, &lock);
    if (!status.ok()) return status;
    const auto start = Clock::now();
    tigon::Status engine_status = entry->session->LoadCheckpoint(absolute);
    RefreshInfo(entry.get());
    if (!engine_status.ok()) return FromEngine(engine_status, *entry);
    // Results remembered from before the load describe a state the session no longer has.
    entry->request_cache.Clear();
    response->set_path(relative);
    response->set_wall_seconds(SecondsSince(start));
    {
      std::lock_guard<std::mutex> info_lock(entry->info_mu);
      response->set_step(entry->info.step);
    }
    spdlog::info("session {} loaded checkpoint '{}' (step {})", entry->id, relative, response->step());
    return grpc::Status::OK;
  });
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
  return Handle("GetServerInfo", ctx, [&](const Caller& caller) -> grpc::Status {
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

}  // namespace tigon::server

namespace tigon::server {

// ---- memory savings -------------------------------------------------------------------------------

grpc::Status TrainerService::MeasureSavings(grpc::ServerContext* ctx, const v1::MeasureSavingsRequest* request,
                                            v1::MeasureSavingsResponse* response) {
  return Handle("MeasureSavings", ctx, [&](const Caller& caller) -> grpc::Status {
    grpc::Status status;
    auto entry = Find(request->session_id(), caller, &status);
    if (entry == nullptr) return status;
    if (entry->world.world_size > 0) {
      return Error(grpc::StatusCode::FAILED_PRECONDITION,
                   "MeasureSavings builds temporary copies of the session on this server alone; a rank of a session "
                   "over several servers cannot be copied that way");
    }
    // Random tokens of the requested shape, checked like any batch (limits included).
    const BatchLimits limits{entry->vocab_size, entry->max_position_embeddings, config_.max_batch_tokens};
    status = ValidateBatchShape(request->batch(), request->seq_len(), limits);
    if (!status.ok()) return status;
    v1::Batch batch;
    batch.set_batch(request->batch());
    batch.set_seq_len(request->seq_len());
    std::mt19937 rng(0);
    for (int64_t i = 0; i < request->batch() * request->seq_len(); ++i) {
      batch.add_input_ids(static_cast<int32_t>(rng() % static_cast<uint32_t>(entry->vocab_size)));
    }
    status = ValidateBatch(batch, limits);
    if (!status.ok()) return status;
    const tigon::Batch engine_batch = ToEngineBatch(batch);

    std::lock_guard<std::mutex> measuring(measure_mu_);
    status = ReserveSessionSlot();
    if (!status.ok()) return status;
    ScopeExit release([this] { ReleaseSessionSlot(); });
    for (const char* kernels : {"fused", "reference"}) {
      if (std::chrono::system_clock::now() >= ctx->deadline()) {
        return Error(grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed during the measurement");
      }
      tigon::SessionOptions options = entry->options;
      options.kernels = kernels;
      options.kernel_overrides.clear();
      std::unique_ptr<tigon::Session> twin;
      tigon::Status engine_status = engine_.create_session(options, &twin);
      if (!engine_status.ok()) return FromEngine(engine_status, *entry);
      if (twin == nullptr) return Error(grpc::StatusCode::INTERNAL, "the engine created no session");
      // Two steps: the first allocates the optimizer state and warms up, the second is timed.
      tigon::StepStats first, second;
      engine_status = twin->TrainStep(engine_batch, {}, &first);
      if (engine_status.ok()) engine_status = twin->TrainStep(engine_batch, {}, &second);
      if (!engine_status.ok()) return FromEngine(engine_status, *entry);
      v1::KernelMeasurement* m =
          std::string(kernels) == "fused" ? response->mutable_fused() : response->mutable_reference();
      m->set_kernels(kernels);
      m->set_peak_allocated_bytes(std::max(first.peak_allocated_bytes, second.peak_allocated_bytes));
      m->set_peak_reserved_bytes(std::max(first.peak_reserved_bytes, second.peak_reserved_bytes));
      m->set_step_seconds(second.wall_seconds);
      m->set_tokens_per_second(second.tokens_per_second);
      if (metrics_ != nullptr) {
        metrics_->RecordSavings(entry->id, entry->model_family, kernels, m->peak_allocated_bytes(), m->step_seconds());
      }
    }
    response->set_saved_bytes(response->reference().peak_allocated_bytes() - response->fused().peak_allocated_bytes());
    if (response->fused().step_seconds() > 0) {
      response->set_speedup(response->reference().step_seconds() / response->fused().step_seconds());
    }
    spdlog::info("session {} MeasureSavings {}x{}: saved {} bytes, speedup {:.3f}", entry->id, request->batch(),
                 request->seq_len(), response->saved_bytes(), response->speedup());
    return grpc::Status::OK;
  });
}

}  // namespace tigon::server
