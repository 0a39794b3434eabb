// An objective's resolved settings (engine.h: kObjectiveNames, LossConfig): the one place that knows each
// objective's inputs, settings and defaults. The batch contract (checks.cpp) and the engine's evaluation
// (src/objectives) both read it. No torch.
#pragma once

#include <string>

#include "tigon/engine.h"

namespace tigon::objectives {

enum class Kind { kCrossEntropy, kLinear, kImportanceSampling, kPpo, kCispo, kDpo, kSimpo, kCpo, kOrpo, kKto };

struct Settings {
  Kind kind = Kind::kCrossEntropy;
  double clip_low_threshold = 0.0, clip_high_threshold = 0.0;
  double beta = 0.0, gamma = 0.0;
  double label_smoothing = 0.0, z_loss = 0.0;
  double cpo_alpha = 0.0;
  double desirable_weight = 1.0, undesirable_weight = 1.0;
  std::string loss_type;  // dpo: "sigmoid", "ipo" or "hinge"
};

// The named objective with `config` over its defaults, checked: kInvalidArgument for an unknown name, a
// setting the objective does not use, or one out of range.
Status Resolve(const std::string& loss_fn, const LossConfig& config, Settings* out);

// Which per-position inputs an objective reads (engine.h's Batch).
bool UsesSampler(Kind kind);    // sampler_logprobs and advantages
bool UsesReference(Kind kind);  // reference_logprobs
bool PairsRows(Kind kind);      // (chosen, rejected) rows
bool IsPerToken(Kind kind);     // independent tokens, count = target tokens

// The objective's part of CheckBatch (engine.h), with the resolved settings in `settings`.
Status CheckObjectiveInputs(const Batch& batch, Settings* settings);

}  // namespace tigon::objectives
