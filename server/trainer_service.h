// tigon.v1.Trainer: converts requests, checks them, calls the engine and converts the status back.
//
// Sessions live in a registry; steps on one session are serialised by its step lock, different
// sessions run concurrently. GetSession/ListSessions answer from a snapshot taken after each call, so
// they never wait for a running step.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "server/auth.h"
#include "server/checkpoint_paths.h"
#include "server/engine_api.h"
#include "server/metrics.h"
#include "server/request_cache.h"
#include "tigon/engine.h"
#include "tigon/v1/trainer.grpc.pb.h"

namespace tigon::server {

struct ServiceConfig {
  int64_t max_sessions = 16;
  int64_t max_batch_tokens = 262144;
  int64_t max_message_bytes = 64 << 20;
  std::string version;  // the server's own version
  // Sessions without a call for this long are closed (their creator is presumed gone); 0 = never.
  double session_idle_timeout_seconds = 0.0;
  // Largest model CreateSession builds (estimated from its config); 0 = no limit.
  int64_t max_parameters = 0;
};

class TrainerService final : public v1::Trainer::Service {
 public:
  TrainerService(ServiceConfig config, EngineApi engine, TokenAuthenticator auth, CheckpointRoot checkpoints,
                 Metrics* metrics /* may be null */);
  ~TrainerService() override;

  grpc::Status CreateSession(grpc::ServerContext* ctx, const v1::CreateSessionRequest* request,
                             v1::SessionInfo* response) override;
  grpc::Status GetSession(grpc::ServerContext* ctx, const v1::GetSessionRequest* request,
                          v1::SessionInfo* response) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse* response) override;
  grpc::Status ForwardBackward(grpc::ServerContext* ctx, const v1::ForwardBackwardRequest* request,
                               v1::StepResult* response) override;
  grpc::Status OptimStep(grpc::ServerContext* ctx, const v1::OptimStepRequest* request,
                         v1::StepResult* response) override;
  grpc::Status TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* request,
                         v1::StepResult* response) override;
  grpc::Status Forward(grpc::ServerContext* ctx, const v1::ForwardRequest* request,
                       v1::ForwardResponse* response) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* ctx, const v1::SaveCheckpointRequest* request,
                              v1::CheckpointResponse* response) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext* ctx, const v1::LoadCheckpointRequest* request,
                              v1::CheckpointResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* ctx, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;
  grpc::Status MeasureSavings(grpc::ServerContext* ctx, const v1::MeasureSavingsRequest* request,
                              v1::MeasureSavingsResponse* response) override;
  grpc::Status NewCommunicatorId(grpc::ServerContext* ctx, const v1::NewCommunicatorIdRequest* request,
                                 v1::NewCommunicatorIdResponse* response) override;

  // Reserves a place among --max-sessions for a session being created (RESOURCE_EXHAUSTED when full).
  grpc::Status ReserveSessionSlot();
  void ReleaseSessionSlot();

  // Closes every session (used at shutdown, after the server stopped taking calls).
  void CloseAllSessions();
  // Closes the sessions idle for longer than the configured timeout, skipping any in a step; returns
  // how many. Runs every few seconds on its own thread when the timeout is set.
  int CloseIdleSessions();
  int64_t active_sessions() const;

  // Shutdown, first half: from now on every new call is answered UNAVAILABLE; calls already admitted
  // run to their end. WaitForCalls then waits until none is left or `deadline` passes (true: none left).
  void BeginDrain();
  bool WaitForCalls(std::chrono::system_clock::time_point deadline);
  int64_t calls_in_flight() const;

 private:
  struct SessionEntry {
    std::string id;
    std::string owner;                        // the caller name that created it (fixed)
    std::timed_mutex step_mu;                 // held for every engine call on this session
    std::unique_ptr<tigon::Session> session;  // guarded by step_mu
    bool closed = false;                      // guarded by step_mu
    RequestCache request_cache;               // guarded by step_mu
    int64_t vocab_size = 0;                   // fixed at creation
    int64_t max_position_embeddings = 0;
    std::string model_family;
    tigon::SessionOptions options;         // as created (MeasureSavings builds temporary twins from it)
    WorldRank world;                       // world_size > 0: one rank of a session over several servers
    std::atomic<int64_t> last_used_ns{0};  // steady clock, at the last call on this session

    mutable std::mutex info_mu;
    tigon::SessionInfo info;  // guarded by info_mu; refreshed after every engine call
  };
  // Runs `body` with the authenticated caller (UNAVAILABLE once draining); turns exceptions into
  // INTERNAL and records the call.
  grpc::Status Handle(const char* method, grpc::ServerContext* ctx,
                      const std::function<grpc::Status(const Caller&)>& body);
  // The session, if it exists (NOT_FOUND) and `caller` may use it (PERMISSION_DENIED).
  std::shared_ptr<SessionEntry> Find(const std::string& session_id, const Caller& caller, grpc::Status* status) const;
  // A request_id seen before on this session: sets `status` (the first result, replayed, or
  // INVALID_ARGUMENT when the id was used by another method) and returns true.
  bool Replay(SessionEntry& entry, const std::string& request_id, const char* method, v1::StepResult* response,
              grpc::Status* status) const;
  // After an engine step: refreshes the session info, maps a failure, or fills the response, remembers it
  // under `request_id` (when given) and records the step's metrics.
  grpc::Status FinishStep(SessionEntry* entry, const char* method, const tigon::Status& engine_status,
                          const tigon::StepStats& stats, const std::string* request_id, v1::StepResult* response);
  // Before any lock: the session exists, the request has a batch that is valid for its model; converted.
  grpc::Status PrepareBatch(const std::string& session_id, const Caller& caller, bool has_batch,
                            const v1::Batch& batch, tigon::Batch* out) const;
  // Takes the session's step lock, giving up when the call's deadline passes first; then checks that
  // the session is still open and that the call is still wanted (not cancelled, deadline not passed).
  grpc::Status Acquire(grpc::ServerContext* ctx, const std::string& session_id, const Caller& caller,
                       std::shared_ptr<SessionEntry>* entry, std::unique_lock<std::timed_mutex>* lock);
  // After the backward pass of a step that started without pending gradients: when the call is no
  // longer wanted (deadline passed, cancelled), drops the step's gradients and returns the status
  // that says nothing was applied; OK otherwise.
  grpc::Status AbandonIfUnwanted(grpc::ServerContext* ctx, SessionEntry* entry, const char* method);
  void RefreshInfo(SessionEntry* entry);
  // Forward-backward calls whose gradients wait for an optimizer step (from the last refreshed info).
  static int64_t PendingBatches(const SessionEntry& entry);
  grpc::Status FromEngine(const tigon::Status& status, const SessionEntry& entry);
  void ToProto(const SessionEntry& entry, v1::SessionInfo* out) const;
  std::string NewSessionId();

  const ServiceConfig config_;
  const EngineApi engine_;
  const TokenAuthenticator auth_;
  const CheckpointRoot checkpoints_;
  Metrics* const metrics_;
  const std::chrono::steady_clock::time_point started_;

  mutable std::mutex sessions_mu_;
  std::map<std::string, std::shared_ptr<SessionEntry>> sessions_;  // guarded by sessions_mu_
  int64_t sessions_being_created_ = 0;                             // guarded by sessions_mu_
  std::mt19937_64 id_rng_;                                         // guarded by sessions_mu_
  std::mutex measure_mu_;  // one MeasureSavings at a time, so that measurements do not overlap

  std::mutex reaper_mu_;
  std::condition_variable reaper_wake_;
  bool stopping_ = false;  // guarded by reaper_mu_
  std::thread reaper_;     // closes idle sessions when session_idle_timeout_seconds > 0

  mutable std::mutex calls_mu_;
  std::condition_variable calls_done_;
  int64_t calls_in_flight_ = 0;  // guarded by calls_mu_
  bool draining_ = false;        // guarded by calls_mu_
};

}  // namespace tigon::server
