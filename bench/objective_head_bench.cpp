// The LM head of a preference or RL step through Tigon's objectives (engine/src/objectives): forward +
// backward of the head alone from given final hidden states, as bench/TARGETS.md measures the post-training
// losses (an 8B DPO step: 4 pairs x 1024 tokens, hidden 4096, vocab 128,256). Prints the median time and
// the peak device memory above the inputs (gradients of hidden and lm_head included), like bench/memory.py.
//
//   tigon-objective-head-bench [--loss dpo|cross_entropy|importance_sampling|ppo|simpo|orpo|cpo|kto]
//       [--rows 8] [--seq 1024] [--hidden 4096] [--vocab 128256] [--steps 10] [--reference-head]
//       [--inputs FILE --outputs FILE]
// --reference-head also computes the reference log-probabilities from a second head in the same call (as a
// reference session on the same server would), instead of taking them as given. --inputs takes hidden,
// lm_head, labels and the objective's inputs from a safetensors file (bench/bench_objectives.py writes
// it; the shape flags are then ignored) and --outputs writes the loss and both gradients of one pass.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/contract/objective_settings.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "objectives/objectives.h"

using tigon::engine::BatchTensors;

namespace {

int64_t Flag(int argc, char** argv, const std::string& name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

std::string TextFlag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return argv[i + 1];
  }
  return fallback;
}

bool HasFlag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == name) return true;
  }
  return false;
}

int64_t AllocatedBytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[0].current;
}

int64_t PeakBytes() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocated_bytes[0].peak;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string loss = TextFlag(argc, argv, "--loss", "dpo");
  const std::string inputs_path = TextFlag(argc, argv, "--inputs", ""), outputs_path = TextFlag(argc, argv, "--outputs", "");
  std::map<std::string, torch::Tensor> given;
  if (!inputs_path.empty()) given = tigon::models::ReadSafetensors(inputs_path);
  int64_t rows = Flag(argc, argv, "--rows", 8), seq = Flag(argc, argv, "--seq", 1024);
  int64_t hidden_size = Flag(argc, argv, "--hidden", 4096), vocab = Flag(argc, argv, "--vocab", 128256);
  if (!given.empty()) {
    rows = given.at("hidden").size(0);
    seq = given.at("hidden").size(1);
    hidden_size = given.at("hidden").size(2);
    vocab = given.at("lm_head").size(0);
  }
  const int steps = static_cast<int>(Flag(argc, argv, "--steps", 10));
  const bool reference_head = HasFlag(argc, argv, "--reference-head");
  tigon::objectives::Settings settings;
  const tigon::Status resolved = tigon::objectives::Resolve(loss, tigon::LossConfig(), &settings);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s\n", resolved.message().c_str());
    return 2;
  }
  // A one-layer model of the head's shape: only its lm_head is used.
  const nlohmann::json config = {{"model_type", "llama"},      {"vocab_size", vocab},
                                 {"hidden_size", hidden_size}, {"intermediate_size", 64},
                                 {"num_hidden_layers", 1},     {"num_attention_heads", hidden_size / 128},
                                 {"num_key_value_heads", 8},   {"head_dim", 128},
                                 {"max_position_embeddings", 4096}};
  const torch::Device device(torch::kCUDA, 0);
  auto model = tigon::models::CreateRandom(config, nullptr, 1, torch::kBFloat16, device);
  torch::Tensor& lm_head = model->parameter("lm_head.weight");
  torch::manual_seed(0);
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  BatchTensors batch;
  batch.labels = torch::randint(0, vocab, {rows, seq}, torch::TensorOptions().dtype(torch::kLong).device(device));
  batch.labels.narrow(1, 0, seq / 4).fill_(tigon::kIgnoreIndex);  // a prompt
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  batch.reference_logprobs = -torch::rand({rows, seq}, fp32) * 12;
  batch.sampler_logprobs = -torch::rand({rows, seq}, fp32) * 12;
  batch.advantages = torch::randn({rows, seq}, fp32);
  batch.desirable = torch::rand({rows}, fp32) < 0.5;
  const torch::Tensor reference_hidden = reference_head ? torch::randn({rows, seq, hidden_size}, bf16) : torch::Tensor();
  torch::Tensor hidden = torch::randn({rows, seq, hidden_size}, bf16);
  if (!given.empty()) {
    torch::NoGradGuard no_grad;
    hidden = given.at("hidden").to(device, torch::kBFloat16);
    lm_head.copy_(given.at("lm_head"));
    batch.labels = given.at("labels").to(device, torch::kLong);
    for (auto [name, field] : {std::pair<const char*, torch::Tensor*>{"reference_logprobs", &batch.reference_logprobs},
                               {"sampler_logprobs", &batch.sampler_logprobs}, {"advantages", &batch.advantages}}) {
      if (given.count(name)) *field = given.at(name).to(device, torch::kFloat32);
    }
    if (given.count("desirable")) batch.desirable = given.at("desirable").to(device).to(torch::kBool);
  }
  hidden.requires_grad_(true);

  std::vector<double> ms;
  int64_t peak_above = 0;
  double loss_value = 0;
  for (int step = 0; step < steps + 3; ++step) {
    lm_head.mutable_grad() = torch::Tensor();
    torch::Tensor h = hidden.detach().clone().requires_grad_(true);  // the fused head may reuse its memory
    cudaDeviceSynchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    const int64_t base = AllocatedBytes();
    const auto start = std::chrono::steady_clock::now();
    if (reference_head) batch.reference_logprobs = model->HeadLogProbs(reference_hidden, batch.labels);
    tigon::engine::ObjectivePass pass;
    if (settings.kind == tigon::objectives::Kind::kCrossEntropy) {
      pass.loss_sum = model->HeadLossSum(h, batch.labels, torch::Tensor());
    } else {
      pass = tigon::engine::HeadObjective(*model, settings, h, batch);
    }
    pass.loss_sum.backward();
    cudaDeviceSynchronize();
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (step >= 3) ms.push_back(elapsed);
    peak_above = std::max(peak_above, PeakBytes() - base);
    loss_value = pass.count > 0 ? pass.loss_sum_value / pass.count : pass.loss_sum.item<double>();
    if (!outputs_path.empty() && step == 0) {
      // The mean loss's gradients (the engine divides by the count when it applies them).
      const double scale = 1.0 / static_cast<double>(std::max<int64_t>(pass.count, 1));
      tigon::models::WriteSafetensors(outputs_path, {{"loss", torch::tensor({static_cast<float>(loss_value)}, torch::kFloat32)},
                                                     {"grad_hidden", (h.grad().to(torch::kFloat32) * scale).cpu()},
                                                     {"grad_lm_head", (lm_head.grad().to(torch::kFloat32) * scale).cpu()}});
    }
  }
  std::sort(ms.begin(), ms.end());
  std::printf("tigon %s head %lld x %lld, hidden %lld, vocab %lld%s: %.2f ms (median of %d), peak %.0f MiB above "
              "the inputs, loss %.5f\n",
              loss.c_str(), static_cast<long long>(rows), static_cast<long long>(seq),
              static_cast<long long>(hidden_size), static_cast<long long>(vocab),
              reference_head ? ", reference head included" : "", ms[ms.size() / 2], steps,
              static_cast<double>(peak_above) / (1 << 20), loss_value);
  return 0;
}
