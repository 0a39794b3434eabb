// tigon.v1.Trainer: converts requests, checks them, calls the engine and converts the status back.
//
// Sessions live in a registry (session_registry.h). Every call on one session goes through
// RunSessionCall, which finds it, checks the request, takes its step lock and answers retried requests;
// each RPC supplies only what differs. Steps on one session are serialised by its step lock, different
// sessions run concurrently. GetSession/ListSessions answer from a snapshot taken after each call, so
// they never wait for a running step.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/auth.h"
#include "server/call_gate.h"
#include "server/checkpoint_paths.h"
#include "server/engine_api.h"
#include "server/metrics.h"
#include "server/model_roots.h"
#include "server/session_journal.h"
#include "server/session_registry.h"
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
  // How long a call numbered in its client's order waits for an earlier one that never reached the server.
  double call_order_timeout_seconds = 30.0;
  // Largest model CreateSession builds (estimated from its config); 0 = no limit.
  int64_t max_parameters = 0;
  // The folders model_path may name besides the caller's checkpoints (--model-root).
  ModelRoots model_roots;
  // --resume-sessions: sessions noted under the checkpoint root come back at their last checkpoint.
  std::shared_ptr<const SessionJournal> journal;  // null: off
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

  // Closes every session (used at shutdown, after the server stopped taking calls). Their journal
  // records stay, for --resume-sessions.
  void CloseAllSessions();
  // At start, with --resume-sessions: recreates each journalled session that has a checkpoint, under
  // its id and owner, and loads the checkpoint into it (session_resume.cpp). Sessions never saved, and
  // those that fail to come back, are logged and forgotten. Returns how many came back.
  int ResumeSessions();
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
  // How a call on a session holds the session.
  enum class Lock {
    kStep,  // the session's step lock, taken within the call's deadline (engine calls)
    kNone,  // none: the call reads the last refreshed info, or serialises itself
  };
  // The parts of a call on one session that differ from one RPC to the next; RunSessionCall does the
  // rest, in this order: find the session and check the caller may use it; wait for the call's turn in
  // its client's order; `check` (the request against
  // the session, before any lock); take the step lock within the deadline and check the session is open
  // and the call still wanted; answer a request_id seen before from the cache; `execute`; refresh the
  // session's info; remember the result under the request_id.
  template <typename Response>
  struct SessionCall {
    const char* method = "";
    const std::string* session_id = nullptr;
    Lock lock = Lock::kStep;
    // Idempotent calls (Response = v1::StepResult): a retry with the same id gets the first result.
    const std::string* request_id = nullptr;
    // Calls a client numbered: run after the calls it sent before them on the session (SessionSequence).
    const v1::CallOrder* order = nullptr;
    // Before the step lock; may be empty.
    std::function<grpc::Status(const SessionEntry&, const Caller&, const tigon::CallContext&)> check;
    // Under the step lock (Lock::kStep); `context` carries the call's deadline and cancellation to the engine.
    std::function<grpc::Status(SessionEntry&, const tigon::CallContext& context, Response*)> execute;
  };
  template <typename Response>
  grpc::Status RunSessionCall(grpc::ServerContext* ctx, const SessionCall<Response>& call, Response* response);

  // Runs `body` with the authenticated caller (UNAVAILABLE once draining); turns exceptions into
  // INTERNAL and records the call.
  grpc::Status Handle(const char* method, grpc::ServerContext* ctx,
                      const std::function<grpc::Status(const Caller&)>& body);
  // Takes the session's step lock, giving up when the call's deadline passes first; then checks that
  // the session is still open and that the call is still wanted (not cancelled, deadline not passed).
  grpc::Status Acquire(const tigon::CallContext& context, SessionEntry& entry,
                       std::unique_lock<std::timed_mutex>* lock);
  // A request_id seen before on this session: sets `status` (the first result, replayed, or
  // INVALID_ARGUMENT when the id was used by another method) and returns true.
  static bool Replay(SessionEntry& entry, const std::string& request_id, const char* method, v1::StepResult* response,
                     grpc::Status* status);
  // After an engine step: maps a failure, or fills the response and records the step's metrics.
  grpc::Status FinishStep(const SessionEntry& entry, const char* method, const tigon::Status& engine_status,
                          const tigon::StepStats& stats, v1::StepResult* response);
  // The request has a batch that is valid for the session's model; converted.
  // The request's batch, checked (the one batch contract) and converted; a reference_session_id is
  // resolved here, before the call's own step lock, by a Forward on that session (its step lock only).
  grpc::Status CheckBatch(const SessionEntry& entry, const Caller& caller, const tigon::CallContext& context,
                          bool has_batch, const v1::Batch& batch, tigon::Batch* out);
  grpc::Status FromEngine(const tigon::Status& status, const SessionEntry& entry);
  // Under the session's step lock: closes it and records why.
  void CloseEntry(SessionEntry& entry, const std::string& why);
  // CreateSession's work for `caller`: checks the request, builds the engine session and registers it
  // (under `entry->id` when that is set). `ctx` is the call's (its deadline and cancellation), or null
  // when the server resumes a session itself.
  grpc::Status BuildSession(const Caller& caller, const v1::CreateSessionRequest& request, grpc::ServerContext* ctx,
                            std::shared_ptr<SessionEntry>* entry);

  const ServiceConfig config_;
  const EngineApi engine_;
  const TokenAuthenticator auth_;
  const CheckpointRoot checkpoints_;
  Metrics* const metrics_;
  const std::chrono::steady_clock::time_point started_;

  SessionRegistry sessions_;
  const SessionJournal journal_off_;
  const SessionJournal& journal_;  // config_.journal, or journal_off_
  std::mutex measure_mu_;  // one MeasureSavings at a time, so that measurements do not overlap

  std::mutex reaper_mu_;
  std::condition_variable reaper_wake_;
  bool stopping_ = false;  // guarded by reaper_mu_
  std::thread reaper_;     // closes idle sessions when session_idle_timeout_seconds > 0

  CallGate calls_;
};

}  // namespace tigon::server
