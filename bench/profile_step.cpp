// Profiles training steps of a randomly initialised model inside one process (no gRPC), with LibTorch's
// Kineto profiler: writes a Chrome trace whose GPU kernels bench/analyze_trace.py sums by category. Also
// prints the unprofiled step time, tokens/s and peak memory, so a trace can be read against the e2e numbers.
//
//   tigon-profile-step --config llama3-8b.json --batch 8 --seq 1024 --trace out/trace.json
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include "tigon/engine.h"

namespace {

struct Args {
  std::string config_path, trace_path = "trace.json", precision = "bf16", kernels = "fused";
  int64_t batch = 8, seq = 1024, warmup = 3, timed = 5, profiled = 2;
  bool optimizer_in_backward = false;
  bool shapes = false;  // record operator input shapes (ties each matmul kernel to its operand shapes)
  std::map<std::string, std::string> overrides;
};

[[noreturn]] void Usage(const std::string& error) {
  std::cerr << error << "\nusage: tigon-profile-step --config FILE [--batch N] [--seq N] [--precision P] "
            << "[--kernels fused|reference] [--override op=choice]... [--warmup N] [--timed N] [--profiled N] "
            << "[--optimizer-in-backward] [--shapes] [--trace FILE]\n";
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage("missing value for " + k);
      return argv[++i];
    };
    if (k == "--config") a.config_path = value();
    else if (k == "--trace") a.trace_path = value();
    else if (k == "--precision") a.precision = value();
    else if (k == "--kernels") a.kernels = value();
    else if (k == "--batch") a.batch = std::stoll(value());
    else if (k == "--seq") a.seq = std::stoll(value());
    else if (k == "--warmup") a.warmup = std::stoll(value());
    else if (k == "--timed") a.timed = std::stoll(value());
    else if (k == "--profiled") a.profiled = std::stoll(value());
    else if (k == "--optimizer-in-backward") a.optimizer_in_backward = true;
    else if (k == "--shapes") a.shapes = true;
    else if (k == "--override") {
      const std::string v = value();
      const auto eq = v.find('=');
      if (eq == std::string::npos) Usage("--override takes op=choice, got " + v);
      a.overrides[v.substr(0, eq)] = v.substr(eq + 1);
    } else Usage("unknown flag " + k);
  }
  if (a.config_path.empty()) Usage("--config is required");
  return a;
}

tigon::Batch RandomBatch(int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  tigon::Batch batch;
  batch.batch = b;
  batch.seq_len = t;
  batch.input_ids.resize(static_cast<size_t>(b * t));
  for (auto& id : batch.input_ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return batch;
}

void Check(const tigon::Status& status, const char* what) {
  if (!status.ok()) {
    std::cerr << what << " failed: " << status.ToString() << "\n";
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  std::ifstream in(args.config_path);
  if (!in) Usage("cannot read " + args.config_path);
  std::stringstream text;
  text << in.rdbuf();

  tigon::SessionOptions options;
  options.config_json = text.str();
  options.precision = args.precision;
  options.kernels = args.kernels;
  options.kernel_overrides = args.overrides;
  options.optimizer_in_backward = args.optimizer_in_backward;
  options.optimizer.lr = 1e-5;
  std::unique_ptr<tigon::Session> session;
  auto t0 = std::chrono::steady_clock::now();
  Check(tigon::CreateSession(options, &session), "CreateSession");
  const auto info = session->Info();
  std::printf("session: %s, %lld parameters, created in %.1f s\n", info.model_family.c_str(),
              static_cast<long long>(info.parameter_count),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  uint32_t seed = 1;
  tigon::StepStats stats;
  for (int64_t i = 0; i < args.warmup; ++i)
    Check(session->TrainStep(RandomBatch(args.batch, args.seq, info.vocab_size, seed++), {}, &stats), "warm-up step");
  double seconds = 0;
  int64_t peak = 0;
  for (int64_t i = 0; i < args.timed; ++i) {
    Check(session->TrainStep(RandomBatch(args.batch, args.seq, info.vocab_size, seed++), {}, &stats), "timed step");
    seconds += stats.wall_seconds;
    peak = std::max(peak, stats.peak_allocated_bytes);
  }
  const double step = seconds / static_cast<double>(std::max<int64_t>(1, args.timed));
  std::printf("step %.1f ms, %.0f tokens/s, peak allocated %.2f GiB, loss %.4f\n", step * 1e3,
              static_cast<double>(args.batch * args.seq) / step, peak / 1073741824.0, stats.loss);

  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/args.shapes);
  const std::set<impl::ActivityType> activities{impl::ActivityType::CPU, impl::ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  for (int64_t i = 0; i < args.profiled; ++i)
    Check(session->TrainStep(RandomBatch(args.batch, args.seq, info.vocab_size, seed++), {}, &stats), "profiled step");
  auto result = prof::disableProfiler();
  result->save(args.trace_path);
  std::printf("trace of %lld step(s): %s\n", static_cast<long long>(args.profiled), args.trace_path.c_str());
  return 0;
}
