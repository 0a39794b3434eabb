// What a session will hold, estimated from its config before anything is allocated, so that a model that
// cannot fit is refused at once with what it needs and what the device has, rather than after minutes of
// allocation (or by the kernel's OOM killer on the CPU).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "models/model.h"
#include "session/flat_parameters.h"
#include "tigon/engine.h"

namespace tigon::engine {

// Activations are counted for a one-row step of up to this many tokens (fewer when the model's
// max_position_embeddings is shorter): the smallest step worth creating a session for. A larger step
// that does not fit fails at the step, with RESOURCE_EXHAUSTED and the session unchanged.
inline constexpr int64_t kEstimateStepTokens = 4096;

struct SessionFootprint {
  int64_t parameters = 0;
  double weight_bytes = 0;     // the parameters in the precision's dtype
  double gradient_bytes = 0;   // the flat gradient buffer (none with the optimizer in backward)
  double optimizer_bytes = 0;  // AdamW's two moments, and bf16_mixed's fp32 master copy
  int64_t step_tokens = 0;
  double activation_bytes = 0;  // a lower bound for a step of step_tokens
  double total() const { return weight_bytes + gradient_bytes + optimizer_bytes + activation_bytes; }
};

SessionFootprint EstimateFootprint(const models::ModelConfig& config, Precision precision, bool optimizer_in_backward);

// kResourceExhausted when the model has more than options.max_parameters parameters (when that is set)
// or its footprint is more than `device` has available; the message says what it needs and what there is.
Status CheckSessionFits(const SessionFootprint& footprint, const SessionOptions& options, const torch::Device& device);

}  // namespace tigon::engine
