// The objectives of engine.h (kObjectiveNames) as functions of the per-token log-probabilities: each gives
// its loss and, per token, the coefficient dL/dlp through which its gradient enters the fused LM head
// (DecoderModel::HeadLossSum with weights -dL/dlp has the gradient of L). Computed on the batch's device,
// in float64 (the tensors are [batch, seq_len]).
#pragma once

#include <torch/types.h>

#include <map>
#include <string>

#include "engine/contract/objective_settings.h"
#include "models/model.h"
#include "tigon/engine.h"

namespace tigon::engine {

// A batch's tensors on the model's device, [B, T] unless said otherwise; undefined when absent.
struct BatchTensors {
  torch::Tensor input_ids;           // int64
  torch::Tensor labels;              // int64, -100 = ignored (the default labels already filled in)
  torch::Tensor weights;             // fp32
  torch::Tensor sampler_logprobs;    // fp32
  torch::Tensor advantages;          // fp32
  torch::Tensor reference_logprobs;  // fp32
  torch::Tensor desirable;           // [B] bool
};
BatchTensors ToBatchTensors(const Batch& batch, const torch::Device& device);

struct ObjectiveValue {
  torch::Tensor coefficients;  // [B, T] fp32: d loss_sum / d lp, 0 where ignored
  double loss_sum = 0.0;       // loss = loss_sum / count
  int64_t count = 0;
  std::map<std::string, double> metrics;
};
// `logprobs`: [B, T] log p(label), 0 where ignored (DecoderModel::HeadLogProbs).
ObjectiveValue EvaluateObjective(const objectives::Settings& settings, const torch::Tensor& logprobs,
                                 const BatchTensors& batch);

// One forward pass of a batch under its objective.
struct ObjectivePass {
  torch::Tensor loss_sum;  // 0-dim with autograd: backward gives the gradient of the objective's loss_sum
  double loss_sum_value = 0.0;
  int64_t count = 0;   // what the loss is a mean over (engine.h: tokens, pairs, rows, or 1)
  int64_t tokens = 0;  // target tokens
  std::map<std::string, double> metrics;
};
// With autograd (ForwardBackward, TrainStep). cross_entropy and linear take the fused head directly; the
// others first read the log-probabilities from the same hidden states without autograd (one more LM-head
// pass, chunked), then send their coefficients through the fused head.
ObjectivePass ForwardObjective(const models::DecoderModel& model, const objectives::Settings& settings,
                               const BatchTensors& batch);
// The head's part of ForwardObjective for an objective other than cross_entropy and linear, from final
// hidden states [B, T, H] (with autograd; the fused head may reuse their memory for their gradient).
ObjectivePass HeadObjective(const models::DecoderModel& model, const objectives::Settings& settings,
                            const torch::Tensor& hidden, const BatchTensors& batch);
// Without gradients (Forward): the loss and figures a step would report, and the log-probabilities.
ObjectivePass EvaluateWithoutGradients(const models::DecoderModel& model, const objectives::Settings& settings,
                                       const BatchTensors& batch, torch::Tensor* logprobs);

}  // namespace tigon::engine
