// tigon-data-parallel-bench: measures data-parallel training over several CUDA devices with the engine
// directly (no server). Its correctness counterpart is tests/engine/test_data_parallel_devices.cpp.
//
//   tigon-data-parallel-bench --devices 0,1 --config FILE [--precision bf16] [--kernels fused|reference]
//                             [--rows-per-device 8] [--seq 2048] [--steps 8] [--warmup 2] [--bucket-mb MB]
//                             [--json FILE] [--processes] [--profile DIR] [--cpu]
//     tokens/s of one device with rows-per-device rows vs all devices with rows-per-device rows each,
//     and the gradient all-reduce time that backward did not hide (median of the measured steps). The
//     one-device runs: each listed device alone (a slow device shows), and a data-parallel session with
//     one replica on the first device (the hooks and NCCL machinery without a second replica). For the
//     data-parallel runs, each replica's forward, backward, wait for the sums and update. The speed-up is
//     given over the mean of the devices alone and over the first one alone.
//     A power-capped GPU runs at higher clocks for its first seconds of work, cold: measured from a cold
//     start a single device looks up to 4% faster than it trains for hours. Give --warmup enough steps for
//     about 25 s of work (100 for Llama-3.2-1B at 8 x 2048 on an H200) to compare steady states.
//     --processes: the data-parallel run with one process per device instead of one thread per device
//     (NCCL ranks, DataParallelOptions.world_size), the same table and JSON. This process makes the NCCL
//     unique id and starts itself once per device with --rank (an internal flag).
//     --profile DIR: after the measured steps, a Kineto trace of two more steps of the one-device run on
//     the first device, of the one-replica data-parallel session and of the data-parallel run
//     (DIR/one_device.json, DIR/one_replica.json, DIR/data_parallel.json; read them with
//     bench/analyze_trace.py --per-device).
//     --cpu: replicas on the CPU (one per listed device, host communicator) to try the benchmark without
//     GPUs (--processes needs CUDA devices and NCCL and is refused there).
//
// Without --config a small Llama (hidden 256, 4 layers, vocab 512) is used.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tigon/data_parallel.h"
#include "tigon/engine.h"

extern char** environ;

namespace {

struct Args {
  std::vector<int> devices = {0, 1};
  std::string config_file;
  std::string precision = "bf16";
  std::string kernels = "fused";
  int steps = 8;
  int warmup = 2;
  int rows = 8;  // per device
  int seq = 2048;
  double bucket_mb = 0;
  std::string json_file;
  bool cpu = false;         // replicas on the CPU (host communicator): tries the benchmark without GPUs
  bool processes = false;   // one process per device
  std::string profile_dir;  // Kineto traces here
  // A rank of --processes (started by it): this process's rank, the hex NCCL unique id, where to write.
  int rank = -1;
  std::string unique_id_hex;
  std::string out_file;
};

[[noreturn]] void Usage(const char* error) {
  if (error) std::fprintf(stderr, "tigon-data-parallel-bench: %s\n\n", error);
  std::fprintf(stderr,
               "usage: tigon-data-parallel-bench [--devices 0,1] [--config FILE] [--precision P]\n"
               "           [--kernels fused|reference] [--steps N] [--warmup N] [--rows-per-device N] [--seq T]\n"
               "           [--bucket-mb MB] [--json FILE] [--cpu] [--processes] [--profile DIR]\n");
  std::exit(error ? 2 : 0);
}

std::vector<int> ParseDevices(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    try {
      if (k == "--devices") a.devices = ParseDevices(value());
      else if (k == "--config") a.config_file = value();
      else if (k == "--precision") a.precision = value();
      else if (k == "--kernels") a.kernels = value();
      else if (k == "--steps") a.steps = std::stoi(value());
      else if (k == "--warmup") a.warmup = std::stoi(value());
      else if (k == "--rows-per-device") a.rows = std::stoi(value());
      else if (k == "--seq") a.seq = std::stoi(value());
      else if (k == "--bucket-mb") a.bucket_mb = std::stod(value());
      else if (k == "--json") a.json_file = value();
      else if (k == "--cpu") a.cpu = true;
      else if (k == "--processes") a.processes = true;
      else if (k == "--profile") a.profile_dir = value();
      else if (k == "--rank") a.rank = std::stoi(value());
      else if (k == "--unique-id") a.unique_id_hex = value();
      else if (k == "--out") a.out_file = value();
      else if (k == "--help" || k == "-h") Usage(nullptr);
      else Usage(("unknown flag " + k).c_str());
    } catch (const std::logic_error&) {
      Usage(("bad number for " + k).c_str());
    }
  }
  if (a.processes && a.cpu)
    Usage("--processes runs one NCCL rank per CUDA device; --cpu has no NCCL (CPU replicas share one process)");
  if (a.processes && !a.profile_dir.empty())
    Usage("--profile traces the in-process run; give it without --processes");
  if (a.devices.size() < 2) Usage("give at least two devices");
  if (a.steps < 1 || a.rows < 1 || a.seq < 2 || a.warmup < 0) Usage("sizes must be positive");
  return a;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tigon-data-parallel-bench: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

constexpr const char* kSmallLlama =
    "{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 256, \"intermediate_size\": 512, "
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, "
    "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
    "\"initializer_range\": 0.02}";

int VocabSize(const std::string& config) {
  const auto at = config.find("\"vocab_size\"");
  if (at == std::string::npos) return 256;
  return std::atoi(config.c_str() + config.find(':', at) + 1);
}

tigon::Batch RandomBatch(int rows, int seq, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  tigon::Batch batch;
  batch.batch = rows;
  batch.seq_len = seq;
  batch.input_ids.resize(static_cast<size_t>(rows) * seq);
  for (auto& id : batch.input_ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return batch;
}

tigon::SessionOptions Options(const Args& a, const std::string& config, std::vector<int> devices) {
  tigon::SessionOptions o;
  o.config_json = config;
  o.precision = a.precision;
  o.kernels = a.kernels;
  o.seed = 3;
  o.optimizer.lr = 1e-4;
  o.optimizer.weight_decay = 0.01;
  o.optimizer.max_grad_norm = 1.0;
  if (!a.cpu) o.devices = std::move(devices);
  return o;
}

// A plain session for one replica, a data-parallel one for several (or for one, with data_parallel).
std::unique_ptr<tigon::Session> Create(const tigon::SessionOptions& options, const Args& a, int replicas,
                                       bool data_parallel = false) {
  std::unique_ptr<tigon::Session> session;
  tigon::Status status;
  if (replicas > 1 || data_parallel) {
    tigon::DataParallelOptions parallel;
    if (a.cpu) parallel.cpu_replicas = replicas;
    parallel.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
    parallel.collective_timeout_seconds = 120;
    status = tigon::CreateDataParallelSession(options, parallel, &session);
  } else {
    status = tigon::CreateSession(options, &session);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "tigon-data-parallel-bench: creating a session on %d device(s) failed: %s\n", replicas,
                 status.ToString().c_str());
    std::exit(1);
  }
  return session;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct BenchResult {
  std::string run;  // what was measured, for the tables
  int devices = 0;
  int rows = 0;
  double tokens_per_second = 0, step_ms = 0, allreduce_ms = 0, exposed_ms = 0, fb_ms = 0;
  int buckets = 0, buckets_after_backward = 0;
  int64_t peak_bytes = 0;
  bool data_parallel = false;
  std::vector<std::string> replica_devices;  // per replica (data-parallel runs)
  std::vector<tigon::ReplicaTimings> replicas;  // per replica: the median of each field
};

// Per field, the median over steps of each replica's timings.
std::vector<tigon::ReplicaTimings> MedianTimings(const std::vector<std::vector<tigon::ReplicaTimings>>& steps) {
  std::vector<tigon::ReplicaTimings> out;
  if (steps.empty()) return out;
  out.resize(steps.front().size());
  for (size_t r = 0; r < out.size(); ++r) {
    auto median = [&](double tigon::ReplicaTimings::*field) {
      std::vector<double> values;
      for (const auto& step : steps)
        if (r < step.size()) values.push_back(step[r].*field);
      return Median(values);
    };
    out[r].forward_ms = median(&tigon::ReplicaTimings::forward_ms);
    out[r].backward_ms = median(&tigon::ReplicaTimings::backward_ms);
    out[r].wait_ms = median(&tigon::ReplicaTimings::wait_ms);
    out[r].update_ms = median(&tigon::ReplicaTimings::update_ms);
    out[r].forward_backward_ms = median(&tigon::ReplicaTimings::forward_backward_ms);
    out[r].host_forward_ms = median(&tigon::ReplicaTimings::host_forward_ms);
  }
  return out;
}

// CPUs the calling thread may run on (threads it creates inherit the set): a library that narrowed it
// would crowd every replica's threads onto a few cores.
int AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  return CPU_COUNT(&set);
}

std::string DeviceName(const Args& a, int device) {
  return a.cpu ? "cpu" : "cuda:" + std::to_string(device);
}

std::string DeviceList(const std::vector<int>& devices) {
  std::string out;
  for (int d : devices) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

// Profiles `steps` more train steps of `session` into `trace_path`; false (with a message) on failure.
bool ProfileSteps(tigon::Session& session, const std::string& trace_path, int rows, int seq, int vocab) {
  tigon::Status status = tigon::StartTrace();
  for (int step = 0; status.ok() && step < 2; ++step) {
    tigon::StepStats stats;
    status = session.TrainStep(RandomBatch(rows, seq, vocab, 5000 + step), {}, &stats);
    if (!status.ok()) {
      tigon::StopTrace(trace_path);
      break;
    }
  }
  if (status.ok()) status = tigon::StopTrace(trace_path);
  if (!status.ok()) {
    std::fprintf(stderr, "tigon-data-parallel-bench: --profile: %s\n", status.ToString().c_str());
    return false;
  }
  std::printf("trace of 2 steps: %s\n", trace_path.c_str());
  return true;
}

// tokens/s and timings of `devices` (one replica each). One device makes a plain session unless
// data_parallel; trace_path, when given, receives a Kineto trace of two more steps.
BenchResult Bench(const Args& a, const std::string& config, const std::vector<int>& devices, bool data_parallel,
                  const std::string& run, const std::string& trace_path, bool* trace_ok) {
  const int vocab = VocabSize(config);
  auto session = Create(Options(a, config, devices), a, static_cast<int>(devices.size()), data_parallel);
  std::printf("%s: created; this thread may run on %d CPUs\n", run.c_str(), AllowedCpus());
  std::fflush(stdout);
  BenchResult r;
  r.run = run;
  r.devices = static_cast<int>(devices.size());
  r.rows = a.rows * r.devices;
  r.data_parallel = data_parallel || r.devices > 1;
  for (int d : devices) r.replica_devices.push_back(DeviceName(a, d));
  std::vector<double> tps, step_ms, allreduce, exposed, fb;
  std::vector<std::vector<tigon::ReplicaTimings>> replica_steps;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    const auto batch = RandomBatch(r.rows, a.seq, vocab, 1000 + step);
    tigon::StepStats stats;
    tigon::Status status = session->TrainStep(batch, {}, &stats);
    if (!status.ok()) {
      std::fprintf(stderr, "tigon-data-parallel-bench: step of %s failed: %s\n", run.c_str(),
                   status.ToString().c_str());
      std::exit(1);
    }
    if (step < a.warmup) continue;
    // Tokens fed (rows x seq), as the single-device benchmarks count them.
    tps.push_back(static_cast<double>(r.rows) * a.seq / stats.wall_seconds);
    step_ms.push_back(1e3 * stats.wall_seconds);
    r.peak_bytes = std::max(r.peak_bytes, stats.peak_allocated_bytes);
    tigon::DataParallelTimings t;
    if (tigon::LastDataParallelTimings(*session, &t)) {
      allreduce.push_back(t.allreduce_ms);
      exposed.push_back(t.exposed_ms);
      fb.push_back(t.forward_backward_ms);
      r.buckets = t.buckets;
      r.buckets_after_backward = t.buckets_after_backward;
      replica_steps.push_back(t.per_replica);
    }
  }
  r.tokens_per_second = Median(tps);
  r.step_ms = Median(step_ms);
  r.allreduce_ms = Median(allreduce);
  r.exposed_ms = Median(exposed);
  r.fb_ms = Median(fb);
  r.replicas = MedianTimings(replica_steps);
  if (!trace_path.empty() && !ProfileSteps(*session, trace_path, r.rows, a.seq, vocab)) *trace_ok = false;
  return r;
}

std::string Fixed(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return std::string(text);
}

// The tables and the JSON of a bench: `one` (first device alone, plain session) is the reference of the
// speed-up, `all` the data-parallel run over every device, `others` further one-device runs.
void Report(const Args& a, const char* mode, const BenchResult& one, const std::vector<BenchResult>& others,
            const BenchResult& all) {
  std::vector<const BenchResult*> runs = {&one};
  for (const auto& r : others) runs.push_back(&r);
  runs.push_back(&all);
  const double speedup = one.tokens_per_second > 0 ? all.tokens_per_second / one.tokens_per_second : 0.0;
  // The devices of one host need not be equally fast (one runs hotter and clocks lower): the speed-up over
  // their mean is the fair one; over the first device alone it is also printed.
  double alone_sum = one.tokens_per_second;
  int alone_count = 1;
  for (const auto& r : others) {
    if (r.data_parallel) continue;
    alone_sum += r.tokens_per_second;
    ++alone_count;
  }
  const double alone_mean = alone_sum / alone_count;
  const double speedup_mean = alone_mean > 0 ? all.tokens_per_second / alone_mean : 0.0;
  const double hidden_share = all.allreduce_ms > 0 ? 1.0 - all.exposed_ms / all.allreduce_ms : 0.0;
  std::printf("\n| run | devices | batch | tokens/s | step ms | all-reduce ms | not hidden ms | share not hidden | "
              "buckets (after backward) | peak GiB |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto* r : runs) {
    const bool dp = r->data_parallel;
    const std::string allreduce = dp ? Fixed("%.2f", r->allreduce_ms) : "-";
    const std::string exposed = dp ? Fixed("%.2f", r->exposed_ms) : "-";
    const std::string share =
        dp ? Fixed("%.1f%%", r->allreduce_ms > 0 ? 100.0 * r->exposed_ms / r->allreduce_ms : 0.0) : "-";
    const std::string buckets =
        dp ? std::to_string(r->buckets) + " (" + std::to_string(r->buckets_after_backward) + ")" : "-";
    std::printf("| %s | %d | %d x %d | %.0f | %.1f | %s | %s | %s | %s | %.1f |\n", r->run.c_str(), r->devices,
                r->rows, a.seq, r->tokens_per_second, r->step_ms, allreduce.c_str(), exposed.c_str(), share.c_str(),
                buckets.c_str(), r->peak_bytes / double(1 << 30));
  }
  std::printf("\nPer replica (medians; forward and backward are device time on CUDA, from CUDA events; "
              "host forward is when the host had launched that far):\n");
  std::printf("| run | replica | device | forward ms | backward ms | waiting for sums ms | update ms | "
              "forward+backward ms | host forward ms |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto* r : runs) {
    for (size_t i = 0; i < r->replicas.size(); ++i) {
      const auto& t = r->replicas[i];
      const std::string device = i < r->replica_devices.size() ? r->replica_devices[i] : "?";
      std::printf("| %s | %zu | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f |\n", r->run.c_str(), i, device.c_str(),
                  t.forward_ms, t.backward_ms, t.wait_ms, t.update_ms, t.forward_backward_ms, t.host_forward_ms);
    }
  }
  std::printf("\nspeed-up %.3fx on %zu devices over the mean of %d device(s) alone, %.3fx over the first alone (%s; "
              "target >= %.2fx); %.1f%% of the all-reduce time hidden behind backward\n",
              speedup_mean, a.devices.size(), alone_count, speedup, mode, 0.95 * a.devices.size(),
              100.0 * hidden_share);
  if (a.json_file.empty()) return;
  std::ofstream out(a.json_file);
  auto replicas_json = [](const BenchResult& r) {
    std::ostringstream json;
    json << "[";
    for (size_t i = 0; i < r.replicas.size(); ++i) {
      const auto& t = r.replicas[i];
      json << (i ? ", " : "") << "{\"device\": \"" << (i < r.replica_devices.size() ? r.replica_devices[i] : "")
           << "\", \"forward_ms\": " << t.forward_ms << ", \"backward_ms\": " << t.backward_ms
           << ", \"wait_ms\": " << t.wait_ms << ", \"update_ms\": " << t.update_ms
           << ", \"forward_backward_ms\": " << t.forward_backward_ms << ", \"host_forward_ms\": " << t.host_forward_ms
           << "}";
    }
    return json.str() + "]";
  };
  out << "{\"mode\": \"" << mode << "\", \"precision\": \"" << a.precision << "\", \"seq\": " << a.seq
      << ", \"rows_per_device\": " << a.rows << ", \"devices\": " << a.devices.size()
      << ", \"tokens_per_second_one\": " << one.tokens_per_second
      << ", \"tokens_per_second_all\": " << all.tokens_per_second << ", \"speedup\": " << speedup
      << ", \"tokens_per_second_alone_mean\": " << alone_mean << ", \"speedup_over_mean_alone\": " << speedup_mean
      << ", \"allreduce_ms\": " << all.allreduce_ms << ", \"exposed_ms\": " << all.exposed_ms
      << ", \"forward_backward_ms\": " << all.fb_ms << ", \"step_ms_one\": " << one.step_ms
      << ", \"step_ms_all\": " << all.step_ms << ", \"buckets\": " << all.buckets
      << ", \"buckets_after_backward\": " << all.buckets_after_backward
      << ", \"peak_bytes_one\": " << one.peak_bytes << ", \"peak_bytes_all\": " << all.peak_bytes
      << ", \"replicas\": " << replicas_json(all) << ", \"runs\": [";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = *runs[i];
    out << (i ? ", " : "") << "{\"run\": \"" << r.run << "\", \"devices\": " << r.devices
        << ", \"tokens_per_second\": " << r.tokens_per_second << ", \"step_ms\": " << r.step_ms
        << ", \"data_parallel\": " << (r.data_parallel ? "true" : "false") << ", \"replicas\": " << replicas_json(r)
        << "}";
  }
  out << "]}\n";
}

int RunBench(const Args& a, const std::string& config) {
  std::printf("bench: %s, %s kernels, %d rows x %d tokens per device, %d steps after %d warm-up, %s; %d CPUs "
              "allowed\n",
              a.precision.c_str(), a.kernels.c_str(), a.rows, a.seq, a.steps, a.warmup,
              a.cpu ? "CPU replicas" : "one thread per device in this process", AllowedCpus());
  bool trace_ok = true;
  std::string one_trace, one_replica_trace, all_trace;
  if (!a.profile_dir.empty()) {
    std::error_code ignored;
    std::filesystem::create_directories(a.profile_dir, ignored);
    one_trace = a.profile_dir + "/one_device.json";
    one_replica_trace = a.profile_dir + "/one_replica.json";
    all_trace = a.profile_dir + "/data_parallel.json";
  }
  const int front = a.devices.front();
  const BenchResult one =
      Bench(a, config, {front}, false, "1 device alone: " + DeviceName(a, front), one_trace, &trace_ok);
  std::vector<BenchResult> others;
  for (size_t i = 1; i < a.devices.size(); ++i)
    others.push_back(Bench(a, config, {a.devices[i]}, false, "1 device alone: " + DeviceName(a, a.devices[i]), "",
                           &trace_ok));
  others.push_back(
      Bench(a, config, {front}, true, "1 replica, data-parallel session: " + DeviceName(a, front), one_replica_trace,
            &trace_ok));
  const BenchResult all = Bench(a, config, a.devices, true,
                                std::to_string(a.devices.size()) + " devices, one thread each: " +
                                    (a.cpu ? std::string("cpu") : "cuda:" + DeviceList(a.devices)),
                                all_trace, &trace_ok);
  Report(a, "threads", one, others, all);
  if (!trace_ok) {
    std::printf("profile: FAILED (see the message above)\n");
    return 1;
  }
  return 0;
}

// Rank a.rank of the a.devices.size() processes the parent started, joined through the parent's NCCL id.
tigon::DataParallelOptions RankParallelOptions(const Args& a) {
  tigon::DataParallelOptions parallel;
  parallel.world_size = static_cast<int>(a.devices.size());
  parallel.rank = a.rank;
  if (!tigon::UniqueIdFromHex(a.unique_id_hex, &parallel.nccl_unique_id)) parallel.nccl_unique_id.clear();
  parallel.collective_timeout_seconds = 120;
  return parallel;
}

// The rank's session on its own device; null, with the reason on stderr, when it cannot be created.
std::unique_ptr<tigon::Session> CreateRankSession(const Args& a, const std::string& config,
                                                  const tigon::DataParallelOptions& parallel) {
  std::unique_ptr<tigon::Session> session;
  const tigon::Status status =
      tigon::CreateDataParallelSession(Options(a, config, {a.devices[a.rank]}), parallel, &session);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: creating the session failed: %s\n", a.rank, status.ToString().c_str());
    return nullptr;
  }
  return session;
}

// One step of the rank on its rows of `batch`; false, with the reason on stderr, when it fails.
bool TrainRankStep(tigon::Session& session, const Args& a, const tigon::Batch& batch, int step,
                   tigon::StepStats* stats) {
  const tigon::Status status =
      session.TrainStep(tigon::RowsOfRank(batch, a.rank, static_cast<int>(a.devices.size())), {}, stats);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: step %d failed: %s\n", a.rank, step, status.ToString().c_str());
    return false;
  }
  return true;
}

// Starts `self` with `args` (args[0] is the program name); -1 on failure.
pid_t Spawn(const char* self, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Waits for every child; as soon as one fails, the others are stopped (SIGTERM) instead of waiting for them
// in a collective until their timeout. True when all exited with 0.
bool WaitForChildren(std::vector<pid_t> children) {
  bool ok = true;
  size_t left = children.size();
  while (left > 0) {
    int wstatus = 0;
    const pid_t pid = waitpid(-1, &wstatus, 0);
    if (pid < 0) return false;
    auto it = std::find(children.begin(), children.end(), pid);
    if (it == children.end()) continue;
    *it = -1;
    --left;
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) continue;
    if (ok) {
      for (pid_t other : children)
        if (other > 0) kill(other, SIGTERM);
    }
    ok = false;
  }
  return ok;
}

// Starts one child of `self` per rank with args_of_rank(r) (its [0] the program name) and --config when one
// was given. The children in rank order; empty when one cannot be started: then "<prefix>: cannot start rank
// r" goes to `report` and the ranks already started are stopped (they would wait for it until their timeout).
std::vector<pid_t> SpawnRanks(const char* self, const Args& a,
                              const std::function<std::vector<std::string>(int)>& args_of_rank, std::FILE* report,
                              const char* prefix) {
  std::vector<pid_t> children;
  for (int r = 0; r < static_cast<int>(a.devices.size()); ++r) {
    std::vector<std::string> args = args_of_rank(r);
    if (!a.config_file.empty()) {
      args.push_back("--config");
      args.push_back(a.config_file);
    }
    std::fflush(stdout);
    const pid_t pid = Spawn(self, args);
    if (pid < 0) {
      std::fprintf(report, "%s: cannot start rank %d\n", prefix, r);
      for (pid_t started : children) kill(started, SIGTERM);
      WaitForChildren(children);
      return {};
    }
    children.push_back(pid);
  }
  return children;
}

// One rank of bench --processes: trains its rows of the bench batches (those the in-process bench splits
// the same way) and writes to --out one "step <ms>" line per measured step, then "comm <all-reduce ms>
// <not hidden ms> <forward+backward ms> <buckets> <after backward> <peak bytes>" and "replica <forward>
// <backward> <wait> <update> <forward+backward> <host forward>" (medians).
int BenchRankChild(const Args& a, const std::string& config) {
  const int vocab = VocabSize(config);
  const int ranks = static_cast<int>(a.devices.size());
  tigon::DataParallelOptions parallel = RankParallelOptions(a);
  parallel.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  const auto session = CreateRankSession(a, config, parallel);
  if (!session) return 1;
  const int rows = a.rows * ranks;
  std::vector<double> step_ms, allreduce, exposed, fb;
  std::vector<std::vector<tigon::ReplicaTimings>> replica_steps;
  int buckets = 0, after_backward = 0;
  int64_t peak = 0;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    const auto batch = RandomBatch(rows, a.seq, vocab, 1000 + step);
    tigon::StepStats stats;
    if (!TrainRankStep(*session, a, batch, step, &stats)) return 1;
    if (step < a.warmup) continue;
    step_ms.push_back(1e3 * stats.wall_seconds);
    peak = std::max(peak, stats.peak_allocated_bytes);
    tigon::DataParallelTimings t;
    if (tigon::LastDataParallelTimings(*session, &t)) {
      allreduce.push_back(t.allreduce_ms);
      exposed.push_back(t.exposed_ms);
      fb.push_back(t.forward_backward_ms);
      buckets = t.buckets;
      after_backward = t.buckets_after_backward;
      replica_steps.push_back(t.per_replica);
    }
  }
  std::ofstream out(a.out_file);
  out.precision(17);
  for (double ms : step_ms) out << "step " << ms << "\n";
  out << "comm " << Median(allreduce) << " " << Median(exposed) << " " << Median(fb) << " " << buckets << " "
      << after_backward << " " << peak << "\n";
  for (const auto& t : MedianTimings(replica_steps))
    out << "replica " << t.forward_ms << " " << t.backward_ms << " " << t.wait_ms << " " << t.update_ms << " "
        << t.forward_backward_ms << " " << t.host_forward_ms << "\n";
  return out ? 0 : 1;
}

// bench --processes: one process per device (NCCL ranks); the world's tokens/s from the slowest rank of
// each step, then each device alone in this process for the speed-up.
int RunBenchProcesses(const Args& a, const std::string& config, const char* self) {
  const int ranks = static_cast<int>(a.devices.size());
  std::printf("bench: %s, %s kernels, %d rows x %d tokens per device, %d steps after %d warm-up, one process per "
              "device\n",
              a.precision.c_str(), a.kernels.c_str(), a.rows, a.seq, a.steps, a.warmup);
  std::string id;
  tigon::Status status = tigon::NewNcclUniqueId(&id);
  if (!status.ok()) {
    std::fprintf(stderr, "tigon-data-parallel-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  const std::string base = "/tmp/tigon_bench_ranks_" + std::to_string(::getpid());
  const auto children = SpawnRanks(
      self, a,
      [&](int r) -> std::vector<std::string> {
        return {self, "--devices", DeviceList(a.devices), "--rank", std::to_string(r),
                "--unique-id", tigon::UniqueIdToHex(id), "--out", base + "." + std::to_string(r), "--precision", a.precision,
                "--kernels", a.kernels, "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
                "--rows-per-device", std::to_string(a.rows), "--seq", std::to_string(a.seq), "--bucket-mb",
                Fixed("%.17g", a.bucket_mb)};
      },
      stderr, "tigon-data-parallel-bench");
  if (children.empty()) return 1;
  if (!WaitForChildren(children)) {
    std::fprintf(stderr, "tigon-data-parallel-bench: a rank failed (see its messages above)\n");
    return 1;
  }
  BenchResult all;
  all.run = std::to_string(ranks) + " devices, one process each: cuda:" + DeviceList(a.devices);
  all.devices = ranks;
  all.rows = a.rows * ranks;
  all.data_parallel = true;
  std::vector<std::vector<double>> step_ms(ranks);
  for (int r = 0; r < ranks; ++r) {
    const std::string path = base + "." + std::to_string(r);
    std::ifstream in(path);
    std::string kind;
    while (in >> kind) {
      if (kind == "step") {
        double ms = 0;
        in >> ms;
        step_ms[r].push_back(ms);
      } else if (kind == "comm") {
        double allreduce = 0, exposed = 0, fb = 0;
        int buckets = 0, after = 0;
        int64_t peak = 0;
        in >> allreduce >> exposed >> fb >> buckets >> after >> peak;
        if (r == 0) {
          all.allreduce_ms = allreduce;
          all.exposed_ms = exposed;
          all.buckets = buckets;
          all.buckets_after_backward = after;
        }
        all.fb_ms = std::max(all.fb_ms, fb);
        all.peak_bytes = std::max(all.peak_bytes, peak);
      } else if (kind == "replica") {
        tigon::ReplicaTimings t;
        in >> t.forward_ms >> t.backward_ms >> t.wait_ms >> t.update_ms >> t.forward_backward_ms >> t.host_forward_ms;
        all.replicas.push_back(t);
        all.replica_devices.push_back(DeviceName(a, a.devices[r]));
      }
    }
    std::remove(path.c_str());
    if (step_ms[r].size() != static_cast<size_t>(a.steps)) {
      std::fprintf(stderr, "tigon-data-parallel-bench: rank %d reported %zu of %d steps\n", r, step_ms[r].size(),
                   a.steps);
      return 1;
    }
  }
  // A step of the world lasts as long as its slowest rank.
  std::vector<double> world_ms(a.steps, 0.0);
  for (int step = 0; step < a.steps; ++step)
    for (int r = 0; r < ranks; ++r) world_ms[step] = std::max(world_ms[step], step_ms[r][step]);
  all.step_ms = Median(world_ms);
  all.tokens_per_second = all.step_ms > 0 ? static_cast<double>(all.rows) * a.seq / (all.step_ms / 1e3) : 0.0;
  bool unused = true;
  const BenchResult one = Bench(a, config, {a.devices.front()}, false,
                                "1 device alone: " + DeviceName(a, a.devices.front()), "", &unused);
  std::vector<BenchResult> others;
  for (size_t i = 1; i < a.devices.size(); ++i)
    others.push_back(
        Bench(a, config, {a.devices[i]}, false, "1 device alone: " + DeviceName(a, a.devices[i]), "", &unused));
  Report(a, "processes", one, others, all);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  const std::string config = args.config_file.empty() ? kSmallLlama : ReadFile(args.config_file);
  if (args.rank >= 0) return BenchRankChild(args, config);
  if (args.processes) {
    char self[4096] = {};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 1;
    return RunBenchProcesses(args, config, self);
  }
  return RunBench(args, config);
}
