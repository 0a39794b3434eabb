// tigon-data-parallel: checks and measures data-parallel training over several CUDA devices with the
// engine directly (no server).
//
//   tigon-data-parallel check --devices 0,1 [--config FILE] [--precision bf16_mixed] [--steps 8]
//                             [--rows 8] [--seq 256] [--tolerance 0.02]
//     Trains the same batches on one device and data-parallel on the given devices; fails (exit 1) when
//     loss or gradient norm differ by more than the relative tolerance at any step, or when the replicas'
//     weights differ.
//
//   tigon-data-parallel ranks --devices 0,1 [same flags as check]
//     The same check with one process per device: this process makes the NCCL unique id and starts one
//     child per device (rank r drives device r, DataParallelOptions.world_size), each training its rows of
//     the batches; the children's losses and grad norms must match one device on the whole batches.
//
//   tigon-data-parallel bench --devices 0,1 --config FILE [--precision bf16] [--rows-per-device 8]
//                             [--seq 2048] [--steps 8] [--warmup 2] [--bucket-mb 64] [--json FILE]
//     tokens/s of one device with rows-per-device rows vs all devices with rows-per-device rows each,
//     and the gradient all-reduce time that backward did not hide (median of the measured steps).
//
// --cpu runs check and bench with replicas on the CPU (one per listed device) to try the tool without GPUs.
//
// Without --config a small Llama (hidden 256, 4 layers, vocab 512) is used.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tigon/data_parallel.h"

extern char** environ;
#include "tigon/engine.h"

namespace {

struct Args {
  std::string mode;
  std::vector<int> devices = {0, 1};
  std::string config_file;
  std::string precision;
  std::string kernels = "fused";
  int steps = 8;
  int warmup = 2;
  int rows = 8;  // check: rows of the whole batch; bench: rows per device
  int seq = 0;
  double tolerance = 0.02;
  double bucket_mb = 0;
  std::string json_file;
  bool cpu = false;  // replicas on the CPU (host communicator): a smoke test of this tool without GPUs
  // rank-child (started by ranks): this process's rank, the hex NCCL unique id, where to write results.
  int rank = 0;
  std::string unique_id_hex;
  std::string out_file;
};

[[noreturn]] void Usage(const char* error) {
  if (error) std::fprintf(stderr, "tigon-data-parallel: %s\n\n", error);
  std::fprintf(stderr,
               "usage: tigon-data-parallel check|bench [--devices 0,1] [--config FILE] [--precision P]\n"
               "           [--kernels fused|reference] [--steps N] [--warmup N] [--rows N | --rows-per-device N]\n"
               "           [--seq T] [--tolerance R] [--bucket-mb MB] [--json FILE]\n");
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
  if (argc < 2) Usage("give a mode: check or bench");
  Args a;
  a.mode = argv[1];
  if (a.mode != "check" && a.mode != "bench" && a.mode != "ranks" && a.mode != "rank-child")
    Usage("the mode is check, bench or ranks");
  for (int i = 2; i < argc; ++i) {
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
      else if (k == "--rows" || k == "--rows-per-device") a.rows = std::stoi(value());
      else if (k == "--seq") a.seq = std::stoi(value());
      else if (k == "--tolerance") a.tolerance = std::stod(value());
      else if (k == "--bucket-mb") a.bucket_mb = std::stod(value());
      else if (k == "--json") a.json_file = value();
      else if (k == "--cpu") a.cpu = true;
      else if (k == "--rank") a.rank = std::stoi(value());
      else if (k == "--unique-id") a.unique_id_hex = value();
      else if (k == "--out") a.out_file = value();
      else if (k == "--help" || k == "-h") Usage(nullptr);
      else Usage(("unknown flag " + k).c_str());
    } catch (const std::logic_error&) {
      Usage(("bad number for " + k).c_str());
    }
  }
  const bool checking = a.mode != "bench";
  if (a.precision.empty()) a.precision = checking ? "bf16_mixed" : "bf16";
  if (a.seq == 0) a.seq = checking ? 256 : 2048;
  if (a.devices.size() < 2) Usage("give at least two devices");
  if (a.steps < 1 || a.rows < 1 || a.seq < 2 || a.warmup < 0) Usage("sizes must be positive");
  return a;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tigon-data-parallel: cannot read %s\n", path.c_str());
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

std::unique_ptr<tigon::Session> Create(const tigon::SessionOptions& options, const Args& a, int replicas) {
  std::unique_ptr<tigon::Session> session;
  tigon::Status status;
  if (replicas > 1) {
    tigon::DataParallelOptions parallel;
    if (a.cpu) parallel.cpu_replicas = replicas;
    parallel.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
    parallel.collective_timeout_seconds = 120;
    status = tigon::CreateDataParallelSession(options, parallel, &session);
  } else {
    status = tigon::CreateSession(options, &session);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "tigon-data-parallel: creating a session on %d device(s) failed: %s\n", replicas,
                 status.ToString().c_str());
    std::exit(1);
  }
  return session;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// A replica that fails inside the gradient sums (the last device, at its second bucket) must fail the step
// on every replica within seconds, and the next step must succeed on fresh communicators.
bool CheckFailure(const Args& a, const std::string& config) {
  const int vocab = VocabSize(config);
  tigon::DataParallelOptions parallel;
  parallel.bucket_bytes = 1 << 20;
  parallel.collective_timeout_seconds = 60;
  const int failing = static_cast<int>(a.devices.size()) - 1;
  auto fired = std::make_shared<int>(0);
  if (a.cpu) parallel.cpu_replicas = static_cast<int>(a.devices.size());
  parallel.fault_injector = [failing, fired](int replica, const std::string& point) {
    if (replica == failing && point == "bucket:1" && *fired == 0) {
      *fired = 1;
      throw std::runtime_error("CUDA out of memory (injected)");
    }
  };
  std::unique_ptr<tigon::Session> session;
  tigon::Status status = tigon::CreateDataParallelSession(Options(a, config, a.devices), parallel, &session);
  if (!status.ok()) {
    std::printf("failure check: creating the session failed: %s\n", status.ToString().c_str());
    return false;
  }
  const auto batch = RandomBatch(a.rows, a.seq, vocab, 7);
  const auto start = std::chrono::steady_clock::now();
  tigon::StepStats stats;
  status = session->TrainStep(batch, {}, &stats);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool failed_fast = !status.ok() && seconds < 30;
  std::printf("failure check: injected failure on replica %d -> %s after %.2f s\n", failing,
              status.ToString().c_str(), seconds);
  status = session->TrainStep(batch, {}, &stats);
  std::printf("failure check: next step -> %s (step %lld, loss %.5f)\n", status.ToString().c_str(),
              static_cast<long long>(stats.step), stats.loss);
  const bool ok = failed_fast && status.ok() && stats.step == 1 && *fired == 1;
  std::printf("failure check: %s\n", ok ? "passed" : "FAILED");
  return ok;
}

int Check(const Args& a, const std::string& config) {
  const int vocab = VocabSize(config);
  auto single = Create(Options(a, config, {a.devices.front()}), a, 1);
  auto parallel = Create(Options(a, config, a.devices), a, static_cast<int>(a.devices.size()));
  std::printf("check: %zu devices vs device %d, %s, batch %d x %d, %d steps, tolerance %.3g\n", a.devices.size(),
              a.devices.front(), a.precision.c_str(), a.rows, a.seq, a.steps, a.tolerance);
  std::printf("| step | loss 1 device | loss %zu devices | rel. diff | grad norm 1 | grad norm %zu | rel. diff |\n",
              a.devices.size(), a.devices.size());
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  bool ok = true;
  for (int step = 0; step < a.steps; ++step) {
    const auto batch = RandomBatch(a.rows, a.seq, vocab, 100 + step);
    tigon::StepStats s, p;
    tigon::Status status = single->TrainStep(batch, {}, &s);
    if (status.ok()) status = parallel->TrainStep(batch, {}, &p);
    if (!status.ok()) {
      std::printf("step %d failed: %s\n", step, status.ToString().c_str());
      return 1;
    }
    const double dl = Relative(p.loss, s.loss), dg = Relative(p.grad_norm, s.grad_norm);
    ok = ok && dl <= a.tolerance && dg <= a.tolerance && p.tokens == s.tokens;
    std::printf("| %d | %.6f | %.6f | %.2e | %.5f | %.5f | %.2e |\n", step + 1, s.loss, p.loss, dl, s.grad_norm,
                p.grad_norm, dg);
  }
  // Identical rows land on different replicas: equal log-probabilities mean equal weights everywhere.
  auto one = RandomBatch(1, a.seq, vocab, 999);
  tigon::Batch same;
  same.batch = static_cast<int64_t>(a.devices.size());
  same.seq_len = a.seq;
  for (size_t r = 0; r < a.devices.size(); ++r)
    same.input_ids.insert(same.input_ids.end(), one.input_ids.begin(), one.input_ids.end());
  tigon::ForwardResult fp, fs;
  if (!parallel->Forward(same, &fp).ok() || !single->Forward(one, &fs).ok()) {
    std::printf("forward failed\n");
    return 1;
  }
  bool identical = true;
  double worst = 0;
  for (size_t r = 1; r < a.devices.size(); ++r)
    for (int t = 0; t < a.seq; ++t) identical = identical && fp.logprobs[t] == fp.logprobs[r * a.seq + t];
  for (int t = 0; t < a.seq; ++t) worst = std::max(worst, static_cast<double>(std::abs(fp.logprobs[t] - fs.logprobs[t])));
  std::printf("replica weights bit-identical: %s; max |log p| difference to one device: %.3e\n",
              identical ? "yes" : "NO", worst);
  ok = ok && identical;
  ok = CheckFailure(a, config) && ok;
  std::printf("check: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct BenchResult {
  int devices = 0;
  int rows = 0;
  double tokens_per_second = 0, step_ms = 0, allreduce_ms = 0, exposed_ms = 0, fb_ms = 0;
  int buckets = 0, buckets_after_backward = 0;
  int64_t peak_bytes = 0;
};

BenchResult Bench(const Args& a, const std::string& config, const std::vector<int>& devices) {
  const int vocab = VocabSize(config);
  auto session = Create(Options(a, config, devices), a, static_cast<int>(devices.size()));
  BenchResult r;
  r.devices = static_cast<int>(devices.size());
  r.rows = a.rows * r.devices;
  std::vector<double> tps, step_ms, allreduce, exposed, fb;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    const auto batch = RandomBatch(r.rows, a.seq, vocab, 1000 + step);
    tigon::StepStats stats;
    tigon::Status status = session->TrainStep(batch, {}, &stats);
    if (!status.ok()) {
      std::fprintf(stderr, "tigon-data-parallel: step on %d device(s) failed: %s\n", r.devices,
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
    }
  }
  r.tokens_per_second = Median(tps);
  r.step_ms = Median(step_ms);
  r.allreduce_ms = Median(allreduce);
  r.exposed_ms = Median(exposed);
  r.fb_ms = Median(fb);
  return r;
}

int RunBench(const Args& a, const std::string& config) {
  std::printf("bench: %s, %s kernels, %d rows x %d tokens per device, %d steps after %d warm-up\n",
              a.precision.c_str(), a.kernels.c_str(), a.rows, a.seq, a.steps, a.warmup);
  const BenchResult one = Bench(a, config, {a.devices.front()});
  const BenchResult all = Bench(a, config, a.devices);
  const double speedup = all.tokens_per_second / one.tokens_per_second;
  const double hidden_share = all.allreduce_ms > 0 ? 1.0 - all.exposed_ms / all.allreduce_ms : 0.0;
  std::printf("\n| devices | batch | tokens/s | step ms | all-reduce ms | not hidden ms | share not hidden | "
              "buckets (after backward) | peak GiB |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  auto fixed = [](const char* format, double value) {
    char text[64];
    std::snprintf(text, sizeof text, format, value);
    return std::string(text);
  };
  for (const auto* r : {&one, &all}) {
    const bool dp = r->devices > 1;
    const std::string allreduce = dp ? fixed("%.2f", r->allreduce_ms) : "-";
    const std::string exposed = dp ? fixed("%.2f", r->exposed_ms) : "-";
    const std::string share = dp ? fixed("%.1f%%", r->allreduce_ms > 0 ? 100.0 * r->exposed_ms / r->allreduce_ms : 0.0)
                                 : "-";
    const std::string buckets =
        dp ? std::to_string(r->buckets) + " (" + std::to_string(r->buckets_after_backward) + ")" : "-";
    std::printf("| %d | %d x %d | %.0f | %.1f | %s | %s | %s | %s | %.1f |\n", r->devices, r->rows, a.seq,
                r->tokens_per_second, r->step_ms, allreduce.c_str(), exposed.c_str(), share.c_str(), buckets.c_str(),
                r->peak_bytes / double(1 << 30));
  }
  std::printf("\nspeed-up %.3fx on %zu devices (target >= %.2fx); %.1f%% of the all-reduce time hidden behind "
              "backward\n",
              speedup, a.devices.size(), 0.95 * a.devices.size(), 100.0 * hidden_share);
  if (!a.json_file.empty()) {
    std::ofstream out(a.json_file);
    out << "{\"precision\": \"" << a.precision << "\", \"seq\": " << a.seq << ", \"rows_per_device\": " << a.rows
        << ", \"devices\": " << a.devices.size() << ", \"tokens_per_second_one\": " << one.tokens_per_second
        << ", \"tokens_per_second_all\": " << all.tokens_per_second << ", \"speedup\": " << speedup
        << ", \"allreduce_ms\": " << all.allreduce_ms << ", \"exposed_ms\": " << all.exposed_ms
        << ", \"forward_backward_ms\": " << all.fb_ms << ", \"step_ms_one\": " << one.step_ms
        << ", \"step_ms_all\": " << all.step_ms << ", \"buckets\": " << all.buckets
        << ", \"buckets_after_backward\": " << all.buckets_after_backward
        << ", \"peak_bytes_one\": " << one.peak_bytes << ", \"peak_bytes_all\": " << all.peak_bytes << "}\n";
  }
  return 0;
}

std::string ToHex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// Rows [first, first + count) of the batch that rank r of `ranks` trains: split as the engine splits in
// process (as even as possible, the first ranks taking one more).
tigon::Batch RowsOfRank(const tigon::Batch& batch, int r, int ranks) {
  int64_t first = 0, count = 0;
  for (int k = 0; k <= r; ++k) {
    first += count;
    count = batch.batch / ranks + (k < batch.batch % ranks ? 1 : 0);
  }
  tigon::Batch out;
  out.batch = count;
  out.seq_len = batch.seq_len;
  out.input_ids.assign(batch.input_ids.begin() + first * batch.seq_len,
                       batch.input_ids.begin() + (first + count) * batch.seq_len);
  return out;
}

// One rank of `ranks`: trains its rows and writes "step loss grad_norm tokens" lines to --out.
int RankChild(const Args& a, const std::string& config) {
  const int vocab = VocabSize(config);
  const int ranks = static_cast<int>(a.devices.size());
  tigon::DataParallelOptions parallel;
  parallel.world_size = ranks;
  parallel.rank = a.rank;
  parallel.nccl_unique_id = FromHex(a.unique_id_hex);
  parallel.collective_timeout_seconds = 120;
  std::unique_ptr<tigon::Session> session;
  tigon::Status status =
      tigon::CreateDataParallelSession(Options(a, config, {a.devices[a.rank]}), parallel, &session);
  if (!status.ok()) {
    std::fprintf(stderr, "rank %d: creating the session failed: %s\n", a.rank, status.ToString().c_str());
    return 1;
  }
  std::ofstream out(a.out_file);
  for (int step = 0; step < a.steps; ++step) {
    const auto batch = RandomBatch(a.rows, a.seq, vocab, 100 + step);
    tigon::StepStats stats;
    status = session->TrainStep(RowsOfRank(batch, a.rank, ranks), {}, &stats);
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: step %d failed: %s\n", a.rank, step, status.ToString().c_str());
      return 1;
    }
    char line[128];
    std::snprintf(line, sizeof line, "%d %.17g %.17g %lld\n", step, stats.loss, stats.grad_norm,
                  static_cast<long long>(stats.tokens));
    out << line;
  }
  return out ? 0 : 1;
}

int Ranks(const Args& a, const std::string& config, const char* self) {
  const int ranks = static_cast<int>(a.devices.size());
  std::string id;
  tigon::Status status = tigon::NewNcclUniqueId(&id);
  if (!status.ok()) {
    std::printf("ranks: %s\n", status.ToString().c_str());
    return 1;
  }
  const std::string base = "/tmp/tigon_ranks_" + std::to_string(::getpid());
  std::string devices;
  for (int d : a.devices) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {self, "rank-child", "--devices", devices, "--rank", std::to_string(r),
                                     "--unique-id", ToHex(id), "--out", base + "." + std::to_string(r),
                                     "--precision", a.precision, "--kernels", a.kernels, "--steps",
                                     std::to_string(a.steps), "--rows", std::to_string(a.rows), "--seq",
                                     std::to_string(a.seq)};
    if (!a.config_file.empty()) {
      args.push_back("--config");
      args.push_back(a.config_file);
    }
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ) != 0) {
      std::printf("ranks: cannot start rank %d\n", r);
      return 1;
    }
    children.push_back(pid);
  }
  bool children_ok = true;
  for (pid_t pid : children) {
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    children_ok = children_ok && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  }
  if (!children_ok) {
    std::printf("ranks: a rank failed\nranks: FAILED\n");
    return 1;
  }
  // Every rank must report the same whole-batch numbers, equal to one device's within the tolerance.
  std::vector<std::vector<double>> loss(ranks), norm(ranks);
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(base + "." + std::to_string(r));
    int step;
    double l, g;
    long long tokens;
    while (in >> step >> l >> g >> tokens) {
      loss[r].push_back(l);
      norm[r].push_back(g);
    }
    std::remove((base + "." + std::to_string(r)).c_str());
  }
  auto single = Create(Options(a, config, {a.devices.front()}), a, 1);
  const int vocab = VocabSize(config);
  bool ok = true;
  std::printf("ranks: %d processes vs device %d, %s, batch %d x %d\n", ranks, a.devices.front(), a.precision.c_str(),
              a.rows, a.seq);
  std::printf("| step | loss 1 device | loss (rank 0) | rel. diff | ranks agree |\n| --- | --- | --- | --- | --- |\n");
  for (int step = 0; step < a.steps; ++step) {
    tigon::StepStats s;
    if (!single->TrainStep(RandomBatch(a.rows, a.seq, vocab, 100 + step), {}, &s).ok() ||
        static_cast<int>(loss[0].size()) <= step) {
      std::printf("ranks: step %d missing\nranks: FAILED\n", step);
      return 1;
    }
    bool agree = true;
    for (int r = 1; r < ranks; ++r)
      agree = agree && loss[r].size() > static_cast<size_t>(step) && loss[r][step] == loss[0][step] &&
              norm[r][step] == norm[0][step];
    const double d = Relative(loss[0][step], s.loss);
    ok = ok && agree && d <= a.tolerance && Relative(norm[0][step], s.grad_norm) <= a.tolerance;
    std::printf("| %d | %.6f | %.6f | %.2e | %s |\n", step + 1, s.loss, loss[0][step], d, agree ? "yes" : "NO");
  }
  std::printf("ranks: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  const std::string config = args.config_file.empty() ? kSmallLlama : ReadFile(args.config_file);
  if (args.mode == "check") return Check(args, config);
  if (args.mode == "ranks") {
    char self[4096] = {};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 1;
    return Ranks(args, config, self);
  }
  if (args.mode == "rank-child") return RankChild(args, config);
  return RunBench(args, config);
}
