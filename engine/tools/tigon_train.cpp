// tigon-train: trains a small byte-level model with the engine directly (no server), showing the loss
// fall. Useful to check a build and to compare fused with reference kernels on one machine.
//
//   tigon-train [--text FILE] [--family llama] [--steps 200] [--batch 8] [--seq 128] [--lr 3e-3]
//               [--precision fp32|bf16|bf16_mixed] [--kernels fused|reference] [--seed 0]
//               [--hidden 128] [--layers 4] [--save DIR] [--cpu]
//
// Without --text it trains on generated sentences ("three plus four is seven."), so it needs no data.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "tigon/engine.h"

namespace {

struct Args {
  std::string text_file;
  std::string family = "llama";
  int steps = 200;
  int batch = 8;
  int seq = 128;
  double lr = 3e-3;
  std::string precision = "fp32";
  std::string kernels = "fused";
  uint64_t seed = 0;
  int hidden = 128;
  int layers = 4;
  std::string save_dir;
  bool cpu = false;
};

[[noreturn]] void Usage(const char* error) {
  if (error) std::fprintf(stderr, "tigon-train: %s\n\n", error);
  std::string families;
  for (const auto& family : tigon::SupportedModelFamilies()) families += (families.empty() ? "" : "|") + family;
  std::fprintf(stderr,
               "usage: tigon-train [--text FILE] [--family %s] [--steps N]\n"
               "                   [--batch B] [--seq T] [--lr LR] [--precision fp32|bf16|bf16_mixed]\n"
               "                   [--kernels fused|reference] [--seed S] [--hidden H] [--layers L]\n"
               "                   [--save DIR] [--cpu]\n",
               families.c_str());
  std::exit(error ? 2 : 0);
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
      if (k == "--text") a.text_file = value();
      else if (k == "--family") a.family = value();
      else if (k == "--steps") a.steps = std::stoi(value());
      else if (k == "--batch") a.batch = std::stoi(value());
      else if (k == "--seq") a.seq = std::stoi(value());
      else if (k == "--lr") a.lr = std::stod(value());
      else if (k == "--precision") a.precision = value();
      else if (k == "--kernels") a.kernels = value();
      else if (k == "--seed") a.seed = std::stoull(value());
      else if (k == "--hidden") a.hidden = std::stoi(value());
      else if (k == "--layers") a.layers = std::stoi(value());
      else if (k == "--save") a.save_dir = value();
      else if (k == "--cpu") a.cpu = true;
      else if (k == "--help" || k == "-h") Usage(nullptr);
      else Usage(("unknown flag " + k).c_str());
    } catch (const std::logic_error&) {
      Usage(("bad number for " + k).c_str());
    }
  }
  if (a.steps <= 0 || a.batch <= 0 || a.seq < 2 || a.hidden < 8 || a.layers < 1) Usage("sizes must be positive");
  return a;
}

// Sentences with learnable structure: small additions written in words.
std::string GeneratedText(size_t min_bytes) {
  static const char* kWords[] = {"zero", "one", "two",   "three", "four",  "five",   "six",
                                 "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
                                 "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"};
  std::mt19937 rng(1234);
  std::string text;
  while (text.size() < min_bytes) {
    int a = rng() % 10, b = rng() % 10;
    text += std::string(kWords[a]) + " plus " + kWords[b] + " is " + kWords[a + b] + ". ";
  }
  return text;
}

// Sizes only, with head_dim explicit (some families default it to a constant, Gemma's 256): everything
// else (tied embeddings, activation, ...) is the family's default.
std::string ConfigJson(const Args& a) {
  const int heads = std::max(1, a.hidden / 32);
  const int kv = std::max(1, heads / 2);
  std::ostringstream c;
  c << "{\"model_type\": \"" << a.family << "\", \"vocab_size\": 256, \"hidden_size\": " << a.hidden
    << ", \"intermediate_size\": " << 2 * a.hidden << ", \"num_hidden_layers\": " << a.layers
    << ", \"num_attention_heads\": " << heads << ", \"num_key_value_heads\": " << kv
    << ", \"head_dim\": " << a.hidden / heads << ", \"max_position_embeddings\": " << std::max(a.seq, 128)
    << ", \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"initializer_range\": 0.02}";
  return c.str();
}

// Progress on stderr: a bar redrawn in place on a terminal; in a pipe or a log, where a carriage return
// leaves one long line of overdrawn bars, a plain line every tenth of the run and at its end.
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(STDERR_FILENO) == 1), every_(std::max(1, total / 10)) {}

  void Update(int step, double loss, double tps) {
    if (tty_) {
      const int width = 30;
      int filled = static_cast<int>(static_cast<double>(step) / total_ * width);
      std::fprintf(stderr, "\r[%-*s] %4d/%d  step loss %.4f  %9.0f tok/s", width,
                   std::string(filled, '#').c_str(), step, total_, loss, tps);
    } else if (step % every_ == 0 || step == total_) {
      std::fprintf(stderr, "step %d/%d  step loss %.4f  %.0f tok/s\n", step, total_, loss, tps);
    }
    std::fflush(stderr);
  }

  // Ends the bar's line (a terminal only: the plain lines end themselves).
  void Finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  int total_;
  bool tty_;
  int every_;
};

}  // namespace

int main(int argc, char** argv) {
  Args args = Parse(argc, argv);
  std::string text;
  if (args.text_file.empty()) {
    text = GeneratedText(200000);
  } else {
    std::ifstream in(args.text_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "tigon-train: cannot read %s\n", args.text_file.c_str());
      return 1;
    }
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (text.size() < static_cast<size_t>(args.seq) + 2) {
    std::fprintf(stderr, "tigon-train: the text is shorter than one sequence\n");
    return 1;
  }

  tigon::SessionOptions options;
  options.config_json = ConfigJson(args);
  options.precision = args.precision;
  options.kernels = args.kernels;
  options.seed = args.seed;
  options.optimizer.lr = args.lr;
  options.optimizer.weight_decay = 0.01;
  options.optimizer.max_grad_norm = 1.0;
  if (args.cpu) options.devices = {};
  std::unique_ptr<tigon::Session> session;
  tigon::Status status = tigon::CreateSession(options, &session);
  if (!status.ok()) {
    std::fprintf(stderr, "tigon-train: %s\n", status.ToString().c_str());
    return 1;
  }
  auto info = session->Info();
  std::printf("model %s, %lld parameters, %s, ops:", info.model_family.c_str(),
              static_cast<long long>(info.parameter_count), info.precision.c_str());
  for (const auto& op : info.ops) std::printf(" %s=%s", op.op.c_str(), op.choice.c_str());
  std::printf("\ntraining on %zu bytes, batch %d x %d, %d steps\n", text.size(), args.batch, args.seq, args.steps);

  std::mt19937_64 rng(args.seed + 17);
  std::uniform_int_distribution<size_t> start_dist(0, text.size() - args.seq - 1);
  tigon::Batch batch;
  batch.batch = args.batch;
  batch.seq_len = args.seq;
  batch.input_ids.resize(static_cast<size_t>(args.batch) * args.seq);
  double first_loss = 0, recent = 0, total_seconds = 0;
  int64_t total_tokens = 0;
  const int window = std::min(10, args.steps);
  Progress progress(args.steps);
  for (int step = 1; step <= args.steps; ++step) {
    for (int b = 0; b < args.batch; ++b) {
      size_t start = start_dist(rng);
      for (int t = 0; t < args.seq; ++t)
        batch.input_ids[static_cast<size_t>(b) * args.seq + t] = static_cast<unsigned char>(text[start + t]);
    }
    tigon::StepStats stats;
    status = session->TrainStep(batch, {}, &stats);
    if (!status.ok()) {
      progress.Finish();
      std::fprintf(stderr, "tigon-train: step %d failed: %s\n", step, status.ToString().c_str());
      return 1;
    }
    if (step == 1) first_loss = stats.loss;
    if (step > args.steps - window) recent += stats.loss / window;
    total_seconds += stats.wall_seconds;
    total_tokens += stats.tokens;
    progress.Update(step, stats.loss, stats.tokens_per_second);
  }
  progress.Finish();
  std::printf("loss: first step %.4f, mean of last %d steps %.4f (uniform over 256 bytes: %.4f)\n", first_loss,
              window, recent, std::log(256.0));
  std::printf("throughput: %.0f tokens/s over %.1f s\n", total_tokens / total_seconds, total_seconds);
  if (!args.save_dir.empty()) {
    status = session->SaveCheckpoint(args.save_dir);
    if (!status.ok()) {
      std::fprintf(stderr, "tigon-train: %s\n", status.ToString().c_str());
      return 1;
    }
    std::printf("checkpoint written to %s\n", args.save_dir.c_str());
  }
  return 0;
}
