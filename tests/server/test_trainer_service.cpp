// The whole Trainer service in-process (a real gRPC server and channel) against a fake engine: the
// server-side behaviour that needs no model — registry, limits, serialisation, idempotency,
// deadlines, auth, checkpoint paths, error mapping and metrics.
#include "server/trainer_service.h"

#include "server/parse_errors.h"
#include "server/validation.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace tigon::server {
namespace {

using namespace std::chrono_literals;

// What the fake sessions did, shared with the test.
struct FakeEngine {
  std::atomic<int> sessions_created{0};
  std::atomic<int64_t> last_max_parameters{-1};  // SessionOptions.max_parameters of the last CreateSession
  std::atomic<int> train_steps{0};  // engine TrainStep calls
  std::atomic<int> forward_backwards{0};  // engine ForwardBackward calls
  std::atomic<int> batch_calls{0};  // ForwardBackward, TrainStep and Forward calls, before the fake's own checks
  std::atomic<int> optim_steps{0};
  std::atomic<int> updates{0};  // optimizer updates applied, by TrainStep or OptimStep
  std::atomic<int> discards{0};  // passes whose gradients were dropped because their caller gave up
  std::atomic<int> running{0};
  std::atomic<int> most_running{0};
  std::atomic<int> step_sleep_ms{0};
  std::atomic<int> create_sleep_ms{0};
  std::atomic<bool> throw_next{false};
  std::mutex mu;
  tigon::Status next_error;  // returned once by the next step
  std::vector<std::string> saved, loaded;
  // Sessions over several servers: the devices this fake server has, the world each rank session was
  // created with, and the id NewCommunicatorId returns (empty: refused as a build without NCCL would).
  std::atomic<int> device_count{0};
  std::vector<WorldRank> worlds;  // guarded by mu
  std::vector<std::vector<int>> world_devices;  // guarded by mu
  std::string communicator_id;  // guarded by mu

  // A gate that holds every forward and backward pass (after its step_sleep_ms) while closed: tests that
  // need a pass to be running at some point close it, wait for `running`, act, then open it. No timing
  // window to miss under a sanitizer's slowdown.
  void CloseGate() {
    std::lock_guard<std::mutex> lock(gate_mu);
    gate_closed = true;
  }
  void OpenGate() {
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      gate_closed = false;
    }
    gate_cv.notify_all();
  }
  void PassGate() {
    std::unique_lock<std::mutex> lock(gate_mu);
    gate_cv.wait(lock, [this] { return !gate_closed; });
  }
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_closed = false;  // guarded by gate_mu
};

// Polls `done` until it holds or `limit` passes; true if it held.
bool Eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 20s) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Honours the call context as the engine does (engine.h, CallContext): a step whose caller gave up during
// its forward and backward pass drops that pass's gradients, unless they join pending ones, the update
// runs inside backward or the session is a rank of a world (`world`).
class FakeSession : public tigon::Session {
 public:
  FakeSession(FakeEngine* engine, tigon::SessionOptions options, bool world = false)
      : engine_(engine), options_(std::move(options)), world_(world) {}

  tigon::SessionInfo Info() const override {
    tigon::SessionInfo info;
    info.model_family = "llama";
    info.precision = options_.precision;
    info.parameter_count = 1234;
    info.vocab_size = 256;
    info.max_position_embeddings = 64;
    info.ops = {{"rms_norm", "fused"}, {"swiglu", "reference"}};
    info.step = step_;
    info.accumulated_batches = accumulated_;
    info.optimizer = options_.optimizer;
    info.seed = options_.seed;
    info.optimizer_in_backward = options_.optimizer_in_backward;
    return info;
  }
  tigon::Status ForwardBackward(const tigon::Batch& batch, const tigon::CallContext& context,
                                tigon::StepStats* stats) override {
    ++engine_->batch_calls;
    TIGON_RETURN_IF_ERROR(tigon::CheckBatch(batch, tigon::BatchLimitsOf(Info())));
    const bool first_of_step = accumulated_ == 0;
    return Run([&] {
      ++engine_->forward_backwards;
      ++accumulated_;
      if (first_of_step) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
      stats->loss = 3.0 / (step_ + 1);
      stats->tokens = batch.batch * (batch.seq_len - 1);
      stats->accumulated_batches = accumulated_;
      return tigon::Status();
    });
  }
  tigon::Status OptimStep(const tigon::OptimizerOverrides& overrides, const tigon::CallContext&,
                          tigon::StepStats* stats) override {
    if (accumulated_ == 0) return {tigon::StatusCode::kFailedPrecondition, "engine: no gradients"};
    return Run(/*sleep=*/false, [&] {
      ++engine_->optim_steps;
      ++engine_->updates;
      accumulated_ = 0;
      stats->step = ++step_;
      stats->lr = overrides.lr.value_or(options_.optimizer.lr);
      stats->grad_norm = 0.5;
      return tigon::Status();
    });
  }
  tigon::Status TrainStep(const tigon::Batch& batch, const tigon::OptimizerOverrides& overrides,
                          const tigon::CallContext& context, tigon::StepStats* stats) override {
    ++engine_->batch_calls;
    TIGON_RETURN_IF_ERROR(tigon::CheckBatch(batch, tigon::BatchLimitsOf(Info())));
    const bool stoppable = accumulated_ == 0 && !options_.optimizer_in_backward;
    return Run([&] {
      ++engine_->train_steps;
      ++accumulated_;
      if (stoppable) TIGON_RETURN_IF_ERROR(DropIfUnwanted(context));
      ++engine_->updates;
      accumulated_ = 0;
      stats->step = ++step_;
      stats->loss = 3.0 / step_;
      stats->tokens = batch.batch * (batch.seq_len - 1);
      stats->lr = overrides.lr.value_or(options_.optimizer.lr);
      const bool fused = options_.kernels == "fused";
      stats->wall_seconds = fused ? 0.01 : 0.02;
      stats->tokens_per_second = fused ? 200.0 : 100.0;
      stats->peak_allocated_bytes = fused ? 4096 : 10000;
      return tigon::Status();
    });
  }
  tigon::Status Forward(const tigon::Batch& batch, const tigon::CallContext&, tigon::ForwardResult* result) override {
    ++engine_->batch_calls;
    TIGON_RETURN_IF_ERROR(tigon::CheckBatch(batch, tigon::BatchLimitsOf(Info())));
    return Run([&] {
      result->loss = 1.5;
      result->tokens = batch.batch * (batch.seq_len - 1);
      result->logprobs.assign(batch.input_ids.size(), -0.25f);
      return tigon::Status();
    });
  }
  tigon::Status DiscardGradients() override {
    accumulated_ = 0;
    return {};
  }
  // The folders handed over, by where their descriptors lead.
  static std::string PathOf(int fd) {
    return std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd)).string();
  }
  tigon::Status SaveCheckpointAt(int parent_fd, const std::string& name, const std::string&) override {
    std::lock_guard<std::mutex> lock(engine_->mu);
    engine_->saved.push_back(PathOf(parent_fd) + "/" + name);
    ::mkdirat(parent_fd, name.c_str(), 0755);
    return {};
  }
  tigon::Status LoadCheckpointAt(int dir_fd, const std::string&) override {
    std::lock_guard<std::mutex> lock(engine_->mu);
    engine_->loaded.push_back(PathOf(dir_fd));
    step_ = 100;
    return {};
  }

 private:
  tigon::Status DropIfUnwanted(const tigon::CallContext& context) {
    if (world_) return {};
    tigon::Status wanted = context.Check("during the forward and backward pass");
    if (!wanted.ok()) {
      ++engine_->discards;
      accumulated_ = 0;
    }
    return wanted;
  }
  template <typename F>
  tigon::Status Run(F apply) {
    return Run(/*sleep=*/true, apply);
  }
  // The step_sleep_ms stands for the forward and backward pass: the optimizer update does not sleep.
  template <typename F>
  tigon::Status Run(bool sleep, F apply) {
    int now = ++engine_->running;
    int seen = engine_->most_running.load();
    while (now > seen && !engine_->most_running.compare_exchange_weak(seen, now)) {
    }
    if (sleep) {
      std::this_thread::sleep_for(std::chrono::milliseconds(engine_->step_sleep_ms.load()));
      engine_->PassGate();
    }
    --engine_->running;
    if (engine_->throw_next.exchange(false)) throw std::runtime_error("fake engine exploded");
    {
      std::lock_guard<std::mutex> lock(engine_->mu);
      if (!engine_->next_error.ok()) {
        tigon::Status error = engine_->next_error;
        engine_->next_error = {};
        return error;
      }
    }
    return apply();
  }

  FakeEngine* engine_;
  tigon::SessionOptions options_;
  bool world_;
  int64_t step_ = 0;
  int64_t accumulated_ = 0;
};

class TrainerServiceTest : public testing::Test {
 protected:
  void Start(ServiceConfig config = {}, TokenAuthenticator auth = {}) {
    EngineApi api;
    api.create_session = [this](const tigon::SessionOptions& options, std::unique_ptr<tigon::Session>* out) {
      ++engine_.sessions_created;
      engine_.last_max_parameters = options.max_parameters;
      std::this_thread::sleep_for(std::chrono::milliseconds(engine_.create_sleep_ms.load()));
      *out = std::make_unique<FakeSession>(&engine_, options);
      return tigon::Status();
    };
    api.create_world_session = [this](const tigon::SessionOptions& options, const WorldRank& world,
                                      std::unique_ptr<tigon::Session>* out) {
      {
        std::lock_guard<std::mutex> lock(engine_.mu);
        engine_.worlds.push_back(world);
        engine_.world_devices.push_back(options.devices);
      }
      ++engine_.sessions_created;
      *out = std::make_unique<FakeSession>(&engine_, options, /*world=*/true);
      return tigon::Status();
    };
    api.new_communicator_id = [this](std::string* id) {
      std::lock_guard<std::mutex> lock(engine_.mu);
      if (engine_.communicator_id.empty())
        return tigon::Status(tigon::StatusCode::kInvalidArgument, "this build has no NCCL");
      *id = engine_.communicator_id;
      return tigon::Status();
    };
    api.list_devices = [this] {
      std::vector<tigon::DeviceInfo> devices(engine_.device_count.load());
      for (size_t i = 0; i < devices.size(); ++i) devices[i].index = static_cast<int>(i);
      return devices;
    };
    api.model_families = {"llama"};
    api.engine_version = "fake-1";
    config.version = "9.9.9";
    root_dir_ = std::filesystem::path(testing::TempDir()) / ("tigon_service_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_dir_);
    CheckpointRoot root;
    std::string error;
    ASSERT_TRUE(CheckpointRoot::Open(root_dir_.string(), &root, &error)) << error;
    service_ = std::make_unique<TrainerService>(config, api, std::move(auth), root, &metrics_);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    builder.experimental().SetInterceptorCreators(RequestInterceptors());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Trainer::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    engine_.OpenGate();  // a test that failed with the gate closed must not hold the shutdown
    if (server_) server_->Shutdown();
    service_.reset();
    std::filesystem::remove_all(root_dir_);
  }

  // Rank `rank` of a world of `world_size`, with a communicator id of `id_bytes` copies of `fill`.
  static v1::CreateSessionRequest WorldRequest(int world_size, int rank, size_t id_bytes = kCommunicatorIdBytes,
                                               char fill = '\x01') {
    v1::CreateSessionRequest request;
    request.set_config_json(R"({"model_type": "llama"})");
    request.mutable_world()->set_world_size(world_size);
    request.mutable_world()->set_rank(rank);
    request.mutable_world()->set_communicator_id(std::string(id_bytes, fill));
    return request;
  }

  std::string Create(grpc::Status* status = nullptr) {
    v1::CreateSessionRequest request;
    request.set_config_json(R"({"model_type": "llama"})");
    request.set_precision("fp32");
    v1::SessionInfo info;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->CreateSession(&ctx, request, &info);
    if (status != nullptr)
      *status = s;
    else
      EXPECT_TRUE(s.ok()) << s.error_message();
    return info.session_id();
  }

  static v1::Batch Batch(int rows = 2, int seq_len = 8, int32_t token = 7) {
    v1::Batch batch;
    batch.set_batch(rows);
    batch.set_seq_len(seq_len);
    for (int i = 0; i < rows * seq_len; ++i) batch.add_input_ids(token);
    return batch;
  }

  grpc::Status Train(const std::string& session, v1::StepResult* result, const std::string& request_id = "",
                     std::chrono::milliseconds deadline = 0ms, v1::Batch batch = Batch()) {
    v1::TrainStepRequest request;
    request.set_session_id(session);
    *request.mutable_batch() = std::move(batch);
    request.set_request_id(request_id);
    grpc::ClientContext ctx;
    if (deadline.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    return stub_->TrainStep(&ctx, request, result);
  }

  FakeEngine engine_;
  Metrics metrics_;
  std::filesystem::path root_dir_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

TEST_F(TrainerServiceTest, CreateGetListAndClose) {
  Start();
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, request, &info).ok());
    EXPECT_EQ(info.model_family(), "llama");
    EXPECT_EQ(info.precision(), "fp32");
    EXPECT_EQ(info.vocab_size(), 256);
    ASSERT_EQ(info.fused_ops_size(), 1);
    EXPECT_EQ(info.fused_ops(0), "rms_norm");
    EXPECT_EQ(info.ops_size(), 2);
    EXPECT_TRUE(info.optimizer().has_lr());
  }
  const std::string second = Create();
  {
    grpc::ClientContext ctx;
    v1::ListSessionsResponse list;
    ASSERT_TRUE(stub_->ListSessions(&ctx, {}, &list).ok());
    EXPECT_EQ(list.sessions_size(), 2);
  }
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest request;
    request.set_session_id(id);
    v1::CloseSessionResponse response;
    ASSERT_TRUE(stub_->CloseSession(&ctx, request, &response).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest request;
    request.set_session_id(id);
    v1::CloseSessionResponse response;
    EXPECT_EQ(stub_->CloseSession(&ctx, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  v1::StepResult result;
  EXPECT_EQ(Train(id, &result).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Train(second, &result).ok());
}

TEST_F(TrainerServiceTest, ASessionWhoseCallerLeftDuringCreationIsDropped) {
  ServiceConfig config;
  config.max_sessions = 1;
  Start(config);
  engine_.create_sleep_ms = 400;
  {
    v1::CreateSessionRequest request;
    request.set_config_json(R"({"model_type": "llama"})");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 100ms);
    v1::SessionInfo info;
    EXPECT_EQ(stub_->CreateSession(&ctx, request, &info).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  std::this_thread::sleep_for(500ms);  // the engine finishes building the session
  EXPECT_EQ(engine_.sessions_created, 1);
  EXPECT_EQ(service_->active_sessions(), 0);
  engine_.create_sleep_ms = 0;
  EXPECT_FALSE(Create().empty()) << "the dropped session does not hold the only place";
}

TEST_F(TrainerServiceTest, IdleSessionsAreClosedBusyAndRecentlyUsedOnesAreNot) {
  ServiceConfig config;
  config.session_idle_timeout_seconds = 0.6;  // the reaper thread checks every 0.15 s
  Start(config);
  const std::string idle = Create(), used = Create(), busy = Create();
  engine_.step_sleep_ms = 1000;
  std::thread step([&] {
    v1::StepResult result;
    EXPECT_TRUE(Train(busy, &result).ok());
  });
  for (int i = 0; i < 10; ++i) {  // 1 s of regular calls on `used` while `busy` is in its step
    std::this_thread::sleep_for(100ms);
    grpc::ClientContext ctx;
    v1::GetSessionRequest request;
    request.set_session_id(used);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, request, &info).ok());
  }
  step.join();
  engine_.step_sleep_ms = 0;
  v1::StepResult result;
  EXPECT_EQ(Train(idle, &result).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Train(used, &result).ok());
  EXPECT_TRUE(Train(busy, &result).ok()) << "idle time counts from the end of the step";
  std::this_thread::sleep_for(1500ms);  // then both go idle and are closed
  EXPECT_EQ(service_->active_sessions(), 0);
  EXPECT_EQ(service_->CloseIdleSessions(), 0);
  EXPECT_NE(metrics_.Render().find("tigon_active_sessions 0"), std::string::npos);
}

TEST_F(TrainerServiceTest, SessionLimitIsResourceExhaustedUntilOneCloses) {
  ServiceConfig config;
  config.max_sessions = 2;
  Start(config);
  const std::string first = Create();
  Create();
  grpc::Status status;
  Create(&status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("--max-sessions=2"), std::string::npos) << status.error_message();
  grpc::ClientContext ctx;
  v1::CloseSessionRequest request;
  request.set_session_id(first);
  v1::CloseSessionResponse response;
  ASSERT_TRUE(stub_->CloseSession(&ctx, request, &response).ok());
  Create(&status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(engine_.sessions_created, 3);
}

TEST_F(TrainerServiceTest, RetriedRequestIdIsAnsweredWithoutApplyingAgain) {
  Start();
  const std::string id = Create();
  v1::StepResult first, retry, other;
  ASSERT_TRUE(Train(id, &first, "req-1").ok());
  ASSERT_TRUE(Train(id, &retry, "req-1").ok());
  EXPECT_EQ(engine_.updates, 1);
  EXPECT_FALSE(first.replayed());
  EXPECT_TRUE(retry.replayed());
  EXPECT_EQ(retry.step(), first.step());
  EXPECT_DOUBLE_EQ(retry.loss(), first.loss());
  ASSERT_TRUE(Train(id, &other, "req-2").ok());
  EXPECT_EQ(other.step(), 2);
  ASSERT_TRUE(Train(id, &other).ok());  // no id: always applied
  ASSERT_TRUE(Train(id, &other).ok());
  EXPECT_EQ(engine_.updates, 4);

  // The same id on another method is a client bug, not a retry.
  grpc::ClientContext ctx;
  v1::OptimStepRequest optim;
  optim.set_session_id(id);
  optim.set_request_id("req-1");
  v1::StepResult result;
  auto status = stub_->OptimStep(&ctx, optim, &result);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("already used by a TrainStep"), std::string::npos);
}

TEST_F(TrainerServiceTest, OptimStepWithoutGradientsIsFailedPrecondition) {
  Start();
  const std::string id = Create();
  v1::OptimStepRequest optim;
  optim.set_session_id(id);
  optim.set_request_id("o1");
  v1::StepResult result;
  {
    grpc::ClientContext ctx;
    auto status = stub_->OptimStep(&ctx, optim, &result);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(status.error_message().find("ForwardBackward"), std::string::npos);
  }
  v1::ForwardBackwardRequest fb;
  fb.set_session_id(id);
  *fb.mutable_batch() = Batch();
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ForwardBackward(&ctx, fb, &result).ok());
    EXPECT_EQ(result.accumulated_batches(), i + 1);
  }
  {
    grpc::ClientContext ctx;
    optim.mutable_optimizer()->set_lr(0.5);
    ASSERT_TRUE(stub_->OptimStep(&ctx, optim, &result).ok());
    EXPECT_EQ(result.step(), 1);
    EXPECT_DOUBLE_EQ(result.lr(), 0.5);
  }
  // The failed first attempt with id "o1" was not remembered; the successful one is.
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->OptimStep(&ctx, optim, &result).ok());
    EXPECT_TRUE(result.replayed());
  }
  EXPECT_EQ(engine_.optim_steps, 1);
}

TEST_F(TrainerServiceTest, BadBatchesNeverReachTheEngine) {
  Start();
  const std::string id = Create();
  v1::StepResult result;
  auto status = Train(id, &result, "", 0ms, Batch(2, 8, 256));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("outside the vocabulary"), std::string::npos);
  status = Train(id, &result, "", 0ms, Batch(1, 65));  // max_position_embeddings is 64
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::TrainStepRequest no_batch;
  no_batch.set_session_id(id);
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->TrainStep(&ctx, no_batch, &result).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(engine_.updates, 0);
  EXPECT_EQ(engine_.batch_calls, 0) << "refused before the session's lock, by the engine's own check";
  EXPECT_EQ(Train("s-nope", &result).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Train("", &result).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(TrainerServiceTest, BatchTokenLimitIsResourceExhausted) {
  ServiceConfig config;
  config.max_batch_tokens = 15;
  Start(config);
  const std::string id = Create();
  v1::StepResult result;
  auto status = Train(id, &result);  // 2 x 8 = 16 tokens
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("--max-batch-tokens"), std::string::npos);
  EXPECT_TRUE(Train(id, &result, "", 0ms, Batch(1, 8)).ok());
}

TEST_F(TrainerServiceTest, DeadlinePassingWhileQueuedAppliesNothing) {
  Start();
  const std::string id = Create();
  engine_.CloseGate();
  v1::StepResult slow_result;
  grpc::Status slow_status;
  std::thread slow([&] { slow_status = Train(id, &slow_result); });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the slow step holds the session";
  v1::StepResult result;
  auto status = Train(id, &result, "queued", 150ms);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  engine_.OpenGate();
  slow.join();
  ASSERT_TRUE(slow_status.ok()) << slow_status.error_message();
  // The queued call's handler is done once nothing is in flight: it applied nothing.
  EXPECT_TRUE(Eventually([&] { return service_->calls_in_flight() == 0; }));
  EXPECT_EQ(engine_.updates, 1);
  // The id of the refused call was not remembered: a retry is applied.
  ASSERT_TRUE(Train(id, &result, "queued").ok());
  EXPECT_FALSE(result.replayed());
  EXPECT_EQ(result.step(), 2);
}

TEST_F(TrainerServiceTest, OneSessionIsSerialisedTwoSessionsRunConcurrently) {
  Start();
  const std::string a = Create(), b = Create();
  engine_.step_sleep_ms = 500;
  auto run_pair = [&](const std::string& first, const std::string& second) {
    const auto start = std::chrono::steady_clock::now();
    v1::StepResult r1, r2;
    grpc::Status s1, s2;
    std::thread t1([&] { s1 = Train(first, &r1); });
    std::thread t2([&] { s2 = Train(second, &r2); });
    t1.join();
    t2.join();
    EXPECT_TRUE(s1.ok() && s2.ok());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  engine_.most_running = 0;
  const double same = run_pair(a, a);
  EXPECT_EQ(engine_.most_running, 1);
  EXPECT_GE(same, 0.99);
  engine_.most_running = 0;
  const double different = run_pair(a, b);
  EXPECT_EQ(engine_.most_running, 2);
  EXPECT_LT(different, 0.9);
}

TEST_F(TrainerServiceTest, EngineErrorsAreMappedAndTheServerKeepsServing) {
  Start();
  const std::string id = Create();
  v1::StepResult result;
  {
    std::lock_guard<std::mutex> lock(engine_.mu);
    engine_.next_error = tigon::Status(tigon::StatusCode::kResourceExhausted, "device out of memory: needed 3 GiB");
  }
  auto status = Train(id, &result);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "device out of memory: needed 3 GiB");
  engine_.throw_next = true;
  status = Train(id, &result);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(status.error_message().find("fake engine exploded"), std::string::npos);
  ASSERT_TRUE(Train(id, &result).ok());
  EXPECT_EQ(result.step(), 1);
  const std::string text = metrics_.Render();
  EXPECT_NE(text.find("tigon_out_of_memory_total{model_family=\"llama\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tigon_rpcs_total{code=\"RESOURCE_EXHAUSTED\",method=\"TrainStep\"} 1"), std::string::npos);
  EXPECT_NE(text.find("tigon_rpcs_total{code=\"INTERNAL\",method=\"TrainStep\"} 1"), std::string::npos);
  EXPECT_NE(text.find("tigon_rpcs_total{code=\"OK\",method=\"TrainStep\"} 1"), std::string::npos);
  EXPECT_NE(text.find("tigon_session_loss{model_family=\"llama\",session=\"" + id + "\"} 3"), std::string::npos);
  EXPECT_NE(text.find("tigon_session_op_fused{op=\"rms_norm\",session=\"" + id + "\"} 1"), std::string::npos);
  EXPECT_NE(text.find("tigon_active_sessions 1"), std::string::npos);
}

TEST_F(TrainerServiceTest, CloseWaitsForTheRunningStep) {
  Start();
  const std::string id = Create();
  engine_.CloseGate();
  v1::StepResult result;
  grpc::Status step_status, close_status;
  std::thread step([&] { step_status = Train(id, &result); });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the step reached the engine";
  std::atomic<bool> closed{false};
  std::thread close([&] {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest request;
    request.set_session_id(id);
    v1::CloseSessionResponse response;
    close_status = stub_->CloseSession(&ctx, request, &response);
    closed = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(closed) << "the close returned while the step still ran";
  engine_.OpenGate();
  close.join();
  step.join();
  EXPECT_TRUE(close_status.ok()) << close_status.error_message();
  EXPECT_TRUE(step_status.ok());
  EXPECT_EQ(engine_.updates, 1);
  EXPECT_NE(metrics_.Render().find("tigon_active_sessions 0"), std::string::npos);
}

TEST_F(TrainerServiceTest, TokensAreCheckedOnEveryTrainerCall) {
  Start({}, TokenAuthenticator({"letmein"}));
  grpc::Status status;
  Create(&status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(engine_.sessions_created, 0);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer letmein");
  v1::ServerInfo info;
  ASSERT_TRUE(stub_->GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_TRUE(info.auth_required());
  grpc::ClientContext wrong;
  wrong.AddMetadata("authorization", "Bearer letmeout");
  EXPECT_EQ(stub_->GetServerInfo(&wrong, {}, &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TrainerServiceTest, CheckpointsStayInsideTheRoot) {
  Start();
  const std::string id = Create();
  v1::CheckpointResponse response;
  for (const char* temporary : {"run/a.tmp-123-0", "run.tmp-9-1/a"}) {
    grpc::ClientContext ctx;
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_path(temporary);
    EXPECT_EQ(stub_->SaveCheckpoint(&ctx, request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << temporary;
  }
  {
    grpc::ClientContext ctx;
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_path("../escape");
    EXPECT_EQ(stub_->SaveCheckpoint(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_path("run/a");
    ASSERT_TRUE(stub_->SaveCheckpoint(&ctx, request, &response).ok());
    EXPECT_EQ(response.path(), "run/a");
  }
  {
    grpc::ClientContext ctx;
    v1::LoadCheckpointRequest request;
    request.set_session_id(id);
    request.set_path("run/missing");
    EXPECT_EQ(stub_->LoadCheckpoint(&ctx, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::LoadCheckpointRequest request;
    request.set_session_id(id);
    request.set_path("run/a");
    ASSERT_TRUE(stub_->LoadCheckpoint(&ctx, request, &response).ok());
    EXPECT_EQ(response.step(), 100);
  }
  std::lock_guard<std::mutex> lock(engine_.mu);
  ASSERT_EQ(engine_.saved.size(), 1u);
  EXPECT_EQ(std::filesystem::path(engine_.saved[0]), std::filesystem::canonical(root_dir_) / "run" / "a");
  EXPECT_EQ(engine_.loaded.size(), 1u);
}

TEST_F(TrainerServiceTest, ForwardReturnsLogprobsOnlyWhenAsked) {
  Start();
  const std::string id = Create();
  v1::ForwardRequest request;
  request.set_session_id(id);
  *request.mutable_batch() = Batch(2, 4);
  v1::ForwardResponse response;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Forward(&ctx, request, &response).ok());
    EXPECT_EQ(response.logprobs_size(), 0);
    EXPECT_DOUBLE_EQ(response.loss(), 1.5);
  }
  request.set_return_logprobs(true);
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Forward(&ctx, request, &response).ok());
  EXPECT_EQ(response.logprobs_size(), 8);
}

TEST_F(TrainerServiceTest, ServerInfoReportsLimitsAndVersions) {
  ServiceConfig config;
  config.max_sessions = 5;
  config.max_batch_tokens = 77;
  Start(config);
  Create();
  grpc::ClientContext ctx;
  v1::ServerInfo info;
  ASSERT_TRUE(stub_->GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.version(), "9.9.9");
  EXPECT_EQ(info.engine_version(), "fake-1");
  ASSERT_EQ(info.model_families_size(), 1);
  EXPECT_EQ(info.limits().max_sessions(), 5);
  EXPECT_EQ(info.limits().max_batch_tokens(), 77);
  EXPECT_FALSE(info.auth_required());
  EXPECT_TRUE(info.checkpoints_enabled());
  EXPECT_EQ(info.active_sessions(), 1);
}

TEST_F(TrainerServiceTest, NewCommunicatorIdReturnsTheEnginesIdOrFailedPreconditionWithoutNccl) {
  Start();
  {
    grpc::ClientContext ctx;
    v1::NewCommunicatorIdResponse response;
    const grpc::Status status = stub_->NewCommunicatorId(&ctx, {}, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(status.error_message().find("NCCL"), std::string::npos) << status.error_message();
  }
  const std::string id(kCommunicatorIdBytes, '\x5a');
  {
    std::lock_guard<std::mutex> lock(engine_.mu);
    engine_.communicator_id = id;
  }
  grpc::ClientContext ctx;
  v1::NewCommunicatorIdResponse response;
  ASSERT_TRUE(stub_->NewCommunicatorId(&ctx, {}, &response).ok());
  EXPECT_EQ(response.communicator_id(), id);
}

TEST_F(TrainerServiceTest, AWorldRankReachesTheEngineWithItsDeviceAndIsReportedInItsInfo) {
  engine_.device_count = 2;
  Start();
  const std::string id(kCommunicatorIdBytes, '\x01');
  auto request_for = [&](int rank, std::vector<int> devices) {
    v1::CreateSessionRequest request = WorldRequest(3, rank);
    for (int d : devices) request.add_devices(d);
    request.mutable_world()->set_collective_timeout_seconds(rank == 2 ? 45.0 : 0.0);
    return request;
  };
  for (const auto& [rank, devices] : std::vector<std::pair<int, std::vector<int>>>{{2, {1}}, {0, {}}}) {
    grpc::ClientContext ctx;
    v1::SessionInfo info;
    const grpc::Status status = stub_->CreateSession(&ctx, request_for(rank, devices), &info);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(info.world_size(), 3);
    EXPECT_EQ(info.rank(), rank);
    // MeasureSavings would build single-server copies of one rank: refused.
    grpc::ClientContext measure_ctx;
    v1::MeasureSavingsRequest measure;
    measure.set_session_id(info.session_id());
    measure.set_batch(1);
    measure.set_seq_len(8);
    v1::MeasureSavingsResponse measured;
    EXPECT_EQ(stub_->MeasureSavings(&measure_ctx, measure, &measured).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  std::lock_guard<std::mutex> lock(engine_.mu);
  ASSERT_EQ(engine_.worlds.size(), 2u);
  EXPECT_EQ(engine_.worlds[0].world_size, 3);
  EXPECT_EQ(engine_.worlds[0].rank, 2);
  EXPECT_EQ(engine_.worlds[0].communicator_id, id);
  EXPECT_EQ(engine_.world_devices[0], std::vector<int>{1});
  EXPECT_EQ(engine_.worlds[0].collective_timeout_seconds, 45.0);
  EXPECT_EQ(engine_.worlds[1].collective_timeout_seconds, 0.0);  // the engine's default
  EXPECT_EQ(engine_.worlds[1].rank, 0);
  EXPECT_EQ(engine_.world_devices[1], std::vector<int>{0});  // no device given: device 0
  // A plain session still goes through create_session and reports no world.
  grpc::ClientContext ctx;
  v1::SessionInfo plain;
  v1::CreateSessionRequest request;
  request.set_config_json(R"({"model_type": "llama"})");
  ASSERT_TRUE(stub_->CreateSession(&ctx, request, &plain).ok());
  EXPECT_EQ(plain.world_size(), 0);
  EXPECT_EQ(engine_.worlds.size(), 2u);
}

TEST_F(TrainerServiceTest, BadWorldRanksAreRefusedBeforeTheEngine) {
  engine_.device_count = 2;
  Start();
  struct Case {
    int world_size, rank;
    size_t id_bytes;
    std::vector<int> devices;
    bool in_backward;
    double timeout;
    const char* says;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      {1, 0, kCommunicatorIdBytes, {}, false, 0, "world_size"},
      {kMaxWorldSize + 1, 0, kCommunicatorIdBytes, {}, false, 0, "world_size"},
      {2, 2, kCommunicatorIdBytes, {}, false, 0, "rank"},
      {2, -1, kCommunicatorIdBytes, {}, false, 0, "rank"},
      {2, 0, 127, {}, false, 0, "communicator_id"},
      {2, 0, 0, {}, false, 0, "communicator_id"},
      {2, 0, kCommunicatorIdBytes, {0, 1}, false, 0, "one CUDA device"},
      {2, 0, kCommunicatorIdBytes, {}, true, 0, "optimizer_in_backward"},
      {2, 0, kCommunicatorIdBytes, {}, false, -1, "collective_timeout_seconds"},
      {2, 0, kCommunicatorIdBytes, {}, false, nan, "collective_timeout_seconds"},
      {2, 0, kCommunicatorIdBytes, {}, false, kMaxCollectiveTimeoutSeconds * 2, "collective_timeout_seconds"},
  };
  for (const auto& c : cases) {
    v1::CreateSessionRequest request = WorldRequest(c.world_size, c.rank, c.id_bytes);
    for (int d : c.devices) request.add_devices(d);
    request.set_optimizer_in_backward(c.in_backward);
    request.mutable_world()->set_collective_timeout_seconds(c.timeout);
    grpc::ClientContext ctx;
    v1::SessionInfo info;
    const grpc::Status status = stub_->CreateSession(&ctx, request, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.says << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(c.says), std::string::npos) << status.error_message();
  }
  EXPECT_EQ(engine_.sessions_created, 0);
}

TEST_F(TrainerServiceTest, AWorldRankNeedsACudaDevice) {
  Start();  // the fake server has no devices
  const v1::CreateSessionRequest request = WorldRequest(2, 0);
  grpc::ClientContext ctx;
  v1::SessionInfo info;
  const grpc::Status status = stub_->CreateSession(&ctx, request, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("CUDA device"), std::string::npos) << status.error_message();
  EXPECT_EQ(engine_.sessions_created, 0);
}

TEST_F(TrainerServiceTest, MeasureSavingsRunsTemporaryTwinsAndLeavesTheSessionAlone) {
  ServiceConfig config;
  config.max_sessions = 2;
  Start(config);
  const std::string id = Create();
  v1::MeasureSavingsRequest request;
  request.set_session_id(id);
  request.set_batch(2);
  request.set_seq_len(16);
  v1::MeasureSavingsResponse response;
  {
    grpc::ClientContext ctx;
    auto status = stub_->MeasureSavings(&ctx, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(response.fused().peak_allocated_bytes(), 4096);
  EXPECT_EQ(response.reference().peak_allocated_bytes(), 10000);
  EXPECT_EQ(response.saved_bytes(), 10000 - 4096);
  EXPECT_DOUBLE_EQ(response.speedup(), 2.0);
  EXPECT_EQ(engine_.sessions_created, 3);
  EXPECT_EQ(engine_.train_steps, 4);
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest get;
    get.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, get, &info).ok());
    EXPECT_EQ(info.step(), 0);
  }
  const std::string text = metrics_.Render();
  EXPECT_NE(text.find("tigon_savings_peak_allocated_bytes{kernels=\"reference\",model_family=\"llama\",session=\"" +
                      id + "\"} 10000"),
            std::string::npos)
      << text;
  request.set_seq_len(65);
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->MeasureSavings(&ctx, request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The measurement needs a free session slot: with the limit reached it is refused.
  Create();
  request.set_seq_len(16);
  grpc::ClientContext full;
  EXPECT_EQ(stub_->MeasureSavings(&full, request, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}


// Practice: Tinker and multi-tenant serving systems scope a training run to the key that created it;
// gRPC's authentication guide separates "who are you" (UNAUTHENTICATED) from "may you" (PERMISSION_DENIED).
TEST_F(TrainerServiceTest, SessionsBelongToTheirCreatorOrAnAdmin) {
  Start({}, TokenAuthenticator({{"alice-token", {"alice", false}},
                                {"alice-next", {"alice", false}},
                                {"bob-token", {"bob", false}},
                                {"root-token", {"root", true}}}));
  auto with = [](grpc::ClientContext* ctx, const char* token) {
    ctx->AddMetadata("authorization", std::string("Bearer ") + token);
  };
  std::string id;
  {
    v1::CreateSessionRequest request;
    request.set_config_json(R"({"model_type": "llama"})");
    grpc::ClientContext ctx;
    with(&ctx, "alice-token");
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->CreateSession(&ctx, request, &info).ok());
    id = info.session_id();
  }
  auto train = [&](const char* token) {
    v1::TrainStepRequest request;
    request.set_session_id(id);
    *request.mutable_batch() = Batch();
    grpc::ClientContext ctx;
    with(&ctx, token);
    v1::StepResult result;
    return stub_->TrainStep(&ctx, request, &result).error_code();
  };
  auto get = [&](const char* token) {
    v1::GetSessionRequest request;
    request.set_session_id(id);
    grpc::ClientContext ctx;
    with(&ctx, token);
    v1::SessionInfo info;
    return stub_->GetSession(&ctx, request, &info).error_code();
  };
  auto listed = [&](const char* token) {
    grpc::ClientContext ctx;
    with(&ctx, token);
    v1::ListSessionsResponse list;
    EXPECT_TRUE(stub_->ListSessions(&ctx, {}, &list).ok());
    return list.sessions_size();
  };
  // Another user: refused on every session call, and the engine never sees the call.
  EXPECT_EQ(train("bob-token"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(get("bob-token"), grpc::StatusCode::PERMISSION_DENIED);
  {
    v1::ForwardRequest request;
    request.set_session_id(id);
    *request.mutable_batch() = Batch();
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::ForwardResponse response;
    EXPECT_EQ(stub_->Forward(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::ForwardBackwardRequest request;
    request.set_session_id(id);
    *request.mutable_batch() = Batch();
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::StepResult response;
    EXPECT_EQ(stub_->ForwardBackward(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::OptimStepRequest request;
    request.set_session_id(id);
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::StepResult response;
    EXPECT_EQ(stub_->OptimStep(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_path("bob-was-here");
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::CheckpointResponse response;
    EXPECT_EQ(stub_->SaveCheckpoint(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::MeasureSavingsRequest request;
    request.set_session_id(id);
    request.set_batch(1);
    request.set_seq_len(8);
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::MeasureSavingsResponse response;
    EXPECT_EQ(stub_->MeasureSavings(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::CloseSessionRequest request;
    request.set_session_id(id);
    grpc::ClientContext ctx;
    with(&ctx, "bob-token");
    v1::CloseSessionResponse response;
    EXPECT_EQ(stub_->CloseSession(&ctx, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(engine_.forward_backwards, 0);
  EXPECT_EQ(engine_.updates, 0);
  EXPECT_TRUE(engine_.saved.empty());
  EXPECT_EQ(listed("bob-token"), 0) << "a user lists only its own sessions";
  // The creator, under either of its tokens (a rotation), and an admin may use it.
  EXPECT_EQ(train("alice-token"), grpc::StatusCode::OK);
  EXPECT_EQ(train("alice-next"), grpc::StatusCode::OK);
  EXPECT_EQ(train("root-token"), grpc::StatusCode::OK);
  EXPECT_EQ(get("root-token"), grpc::StatusCode::OK);
  EXPECT_EQ(listed("alice-next"), 1);
  EXPECT_EQ(listed("root-token"), 1);
  EXPECT_EQ(engine_.updates, 3);
  // An unknown session stays NOT_FOUND for everyone.
  id = "s-0000000000000000";
  EXPECT_EQ(get("bob-token"), grpc::StatusCode::NOT_FOUND);
}

// Practice: gRPC's deadline guidance — the server checks the deadline before committing work, so a
// caller that got DEADLINE_EXCEEDED can retry without the step having been applied.
TEST_F(TrainerServiceTest, ADeadlinePassingDuringTheBackwardPassAppliesNothing) {
  Start();
  const std::string id = Create();
  // The pass starts within the deadline and is held until the caller has given up.
  engine_.CloseGate();
  v1::StepResult result;
  grpc::Status status;
  std::thread late([&] { status = Train(id, &result, "late", 2s); });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the pass started";
  late.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  engine_.OpenGate();
  EXPECT_TRUE(Eventually([&] { return engine_.discards == 1; })) << "the server finishes the pass it started";
  EXPECT_EQ(engine_.train_steps, 1) << "one engine call, stopped by its call context before the update";
  EXPECT_EQ(engine_.discards, 1);
  EXPECT_EQ(engine_.updates, 0);
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, request, &info).ok());
    EXPECT_EQ(info.step(), 0);
    EXPECT_EQ(info.accumulated_batches(), 0);
  }
  // Not remembered as done: the retry with the same id is applied, once.
  engine_.step_sleep_ms = 0;
  ASSERT_TRUE(Train(id, &result, "late").ok());
  EXPECT_FALSE(result.replayed());
  EXPECT_EQ(result.step(), 1);
  EXPECT_DOUBLE_EQ(result.loss(), 3.0);
  EXPECT_EQ(engine_.updates, 1);

  // ForwardBackward alone: its gradients are dropped too when they are the first pending ones.
  engine_.CloseGate();
  v1::ForwardBackwardRequest fb;
  fb.set_session_id(id);
  *fb.mutable_batch() = Batch();
  std::thread late_fb([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 2s);
    status = stub_->ForwardBackward(&ctx, fb, &result);
  });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the pass started";
  late_fb.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  engine_.OpenGate();
  EXPECT_TRUE(Eventually([&] { return engine_.discards == 2; }));
  {
    grpc::ClientContext ctx;
    v1::GetSessionRequest request;
    request.set_session_id(id);
    v1::SessionInfo info;
    ASSERT_TRUE(stub_->GetSession(&ctx, request, &info).ok());
    EXPECT_EQ(info.accumulated_batches(), 0);
  }
}

TEST_F(TrainerServiceTest, ARankOfAWorldFinishesAStepWhoseCallerGaveUp) {
  engine_.device_count = 1;
  Start();
  const v1::CreateSessionRequest create = WorldRequest(2, 0);
  v1::SessionInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CreateSession(&ctx, create, &info).ok());
  }
  // The forward and backward pass starts within the deadline and is held until the caller has given up.
  engine_.CloseGate();
  v1::StepResult result;
  grpc::Status status;
  std::thread late([&] { status = Train(info.session_id(), &result, "late", 2s); });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the pass started";
  late.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  engine_.OpenGate();
  // The server finishes the step after the client gave up.
  EXPECT_TRUE(Eventually([&] { return engine_.updates > 0 || engine_.discards > 0; }));
  EXPECT_EQ(engine_.discards, 0);
  EXPECT_EQ(engine_.updates, 1);  // applied, as on the other ranks
  // The retry gets the step's result instead of applying it again.
  engine_.step_sleep_ms = 0;
  ASSERT_TRUE(Train(info.session_id(), &result, "late").ok());
  EXPECT_TRUE(result.replayed());
  EXPECT_EQ(result.step(), 1);
  EXPECT_EQ(engine_.updates, 1);
}

TEST_F(TrainerServiceTest, ASessionWithTheOptimizerInBackwardTrainsInOneEngineCall) {
  Start();
  v1::CreateSessionRequest request;
  request.set_config_json(R"({"model_type": "llama"})");
  request.set_optimizer_in_backward(true);
  grpc::ClientContext ctx;
  v1::SessionInfo info;
  ASSERT_TRUE(stub_->CreateSession(&ctx, request, &info).ok());
  ASSERT_TRUE(info.optimizer_in_backward());
  v1::StepResult result;
  ASSERT_TRUE(Train(info.session_id(), &result).ok());
  EXPECT_EQ(result.step(), 1);
  EXPECT_EQ(engine_.train_steps, 1) << "the update happens inside backward: no separate OptimStep";
  EXPECT_EQ(engine_.optim_steps, 0);
}

TEST_F(TrainerServiceTest, ATrainStepJoiningPendingGradientsIsOneEngineStep) {
  Start();
  const std::string id = Create();
  v1::ForwardBackwardRequest fb;
  fb.set_session_id(id);
  *fb.mutable_batch() = Batch();
  v1::StepResult result;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ForwardBackward(&ctx, fb, &result).ok());
  }
  ASSERT_TRUE(Train(id, &result).ok());
  EXPECT_EQ(result.step(), 1);
  EXPECT_EQ(engine_.train_steps, 1) << "the pending gradients join the step inside the engine";
  ASSERT_TRUE(Train(id, &result).ok());
  EXPECT_EQ(engine_.train_steps, 2) << "without pending gradients too: the engine checks the call context itself";
  EXPECT_EQ(engine_.optim_steps, 0);
  EXPECT_EQ(result.step(), 2);
  EXPECT_EQ(result.accumulated_batches(), 0);
}

// Practice: Tinker/Stripe-style idempotency keys — a request racing its own retry is applied once.
TEST_F(TrainerServiceTest, TwoIdenticalRequestsRacingAreAppliedOnce) {
  Start();
  const std::string id = Create();
  engine_.step_sleep_ms = 200;
  v1::StepResult a, b;
  grpc::Status sa, sb;
  std::thread ta([&] { sa = Train(id, &a, "same-id"); });
  std::thread tb([&] { sb = Train(id, &b, "same-id"); });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok() && sb.ok()) << sa.error_message() << sb.error_message();
  EXPECT_EQ(engine_.updates, 1);
  EXPECT_EQ(engine_.train_steps, 1);
  EXPECT_NE(a.replayed(), b.replayed()) << "one applied, the other answered from the first";
  EXPECT_EQ(a.step(), 1);
  EXPECT_EQ(b.step(), 1);
  EXPECT_DOUBLE_EQ(a.loss(), b.loss());
}

// Practice: Kubernetes/Triton graceful shutdown — readiness goes first, in-flight work finishes.
TEST_F(TrainerServiceTest, DrainRefusesNewCallsAndWaitsForRunningOnes) {
  Start();
  const std::string id = Create();
  engine_.CloseGate();  // the step runs until the drain has been checked
  v1::StepResult result;
  grpc::Status step_status;
  std::thread step([&] { step_status = Train(id, &result); });
  EXPECT_TRUE(Eventually([&] { return engine_.running == 1; })) << "the step reached the engine";
  service_->BeginDrain();
  EXPECT_EQ(service_->calls_in_flight(), 1);
  {
    grpc::ClientContext ctx;
    v1::ServerInfo info;
    auto status = stub_->GetServerInfo(&ctx, {}, &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_NE(status.error_message().find("shutting down"), std::string::npos);
  }
  EXPECT_FALSE(service_->WaitForCalls(std::chrono::system_clock::now() + 50ms)) << "the step still runs";
  engine_.OpenGate();
  EXPECT_TRUE(service_->WaitForCalls(std::chrono::system_clock::now() + 20s));
  step.join();
  EXPECT_TRUE(step_status.ok()) << step_status.error_message();
  EXPECT_EQ(result.step(), 1);
  EXPECT_EQ(service_->calls_in_flight(), 0);
}

TEST_F(TrainerServiceTest, MaxParametersReachesTheEngine) {
  // The engine counts the model's parameters from its config (each family's rules) and refuses a larger
  // one before allocating (tests/engine/test_memory_estimate.cpp); the server hands it the flag.
  ServiceConfig config;
  config.max_parameters = 1'000'000;
  Start(config);
  EXPECT_FALSE(Create().empty());
  EXPECT_EQ(engine_.last_max_parameters, 1'000'000);
}

}  // namespace
}  // namespace tigon::server
