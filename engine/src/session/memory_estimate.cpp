#include "session/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/device_memory.h"

namespace tigon::engine {
namespace {

std::string GiB(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return text;
}

}  // namespace

SessionFootprint EstimateFootprint(const models::ModelConfig& config, Precision precision, bool optimizer_in_backward) {
  SessionFootprint out;
  out.parameters = models::ParameterCount(config);
  const double n = static_cast<double>(out.parameters);
  const double weight = precision == Precision::kFp32 ? 4 : 2;
  out.weight_bytes = n * weight;
  // With the optimizer in backward each gradient is freed as soon as it is applied (flat_parameters.h).
  out.gradient_bytes = optimizer_in_backward ? 0 : n * weight;
  // AdamW's moments are bf16 under bf16 and fp32 otherwise; bf16_mixed adds an fp32 master copy.
  const double moment = precision == Precision::kBf16 ? 2 : 4;
  out.optimizer_bytes = n * 2 * moment + (precision == Precision::kBf16Mixed ? n * 4 : 0);
  out.step_tokens = std::min(config.max_position_embeddings, kEstimateStepTokens);
  // A lower bound, below what every kernel choice keeps for backward: each layer saves at least its input,
  // the normalised input, the attention output and the MLP input (4 x hidden per token), in the activation
  // dtype. Measured on an H200, the fused Llama-3-8B step keeps about 2.5 times this, Llama-3.2-1B 3 times.
  out.activation_bytes = static_cast<double>(out.step_tokens) * static_cast<double>(config.num_hidden_layers) * 4.0 *
                         static_cast<double>(config.hidden_size) * weight;
  return out;
}

Status CheckSessionFits(const SessionFootprint& footprint, const SessionOptions& options, const torch::Device& device) {
  if (options.max_parameters > 0 && footprint.parameters > options.max_parameters) {
    return Status(StatusCode::kResourceExhausted,
                  "server limit: the model would have " + std::to_string(footprint.parameters) +
                      " parameters, more than the " + std::to_string(options.max_parameters) +
                      " this server builds (--max-parameters)");
  }
  const double available = static_cast<double>(AvailableBytes(device));
  if (footprint.total() <= available) return Status::Ok();
  return Status(StatusCode::kResourceExhausted,
                "the session needs at least " + GiB(footprint.total()) + " on " + device.str() + " (" +
                    std::to_string(footprint.parameters) + " parameters: weights " + GiB(footprint.weight_bytes) +
                    ", gradients " + GiB(footprint.gradient_bytes) + ", optimizer state " +
                    GiB(footprint.optimizer_bytes) + ", activations of a " + std::to_string(footprint.step_tokens) +
                    "-token step " + GiB(footprint.activation_bytes) + "); " + device.str() + " has " +
                    GiB(available) + " available");
}

}  // namespace tigon::engine
