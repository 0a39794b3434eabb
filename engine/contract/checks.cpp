// The checks engine.h exports: batches, optimizer settings, session choices and the call context. No
// torch: the server links this file's library without the engine (engine/CMakeLists.txt).
#include <cmath>
#include <sstream>
#include <string>

#include "engine/contract/objective_settings.h"
#include "tigon/engine.h"

namespace tigon {
namespace {

Status Invalid(const std::string& message) { return Status(StatusCode::kInvalidArgument, message); }

// "input_ids[1][5]" for flat index 21 of a [batch, 16] batch.
std::string Position(const char* field, int64_t index, int64_t seq_len) {
  std::ostringstream out;
  out << field << "[" << index / seq_len << "][" << index % seq_len << "]";
  return out.str();
}

template <size_t N>
bool OneOf(const std::string& value, const char* const (&allowed)[N]) {
  for (const char* a : allowed) {
    if (value == a) return true;
  }
  return false;
}

template <size_t N>
std::string Join(const char* const (&items)[N]) {
  std::string out;
  for (const char* item : items) out += (out.empty() ? "" : ", ") + std::string(item);
  return out;
}

}  // namespace

BatchLimits BatchLimitsOf(const SessionInfo& info) {
  BatchLimits limits;
  limits.vocab_size = info.vocab_size;
  limits.max_position_embeddings = info.max_position_embeddings;
  return limits;
}

Status CheckBatchShape(int64_t rows, int64_t seq_len, const BatchLimits& limits) {
  if (rows <= 0 || seq_len <= 0) {
    std::ostringstream out;
    out << "batch and seq_len must be positive (got batch=" << rows << ", seq_len=" << seq_len << ")";
    return Invalid(out.str());
  }
  // The product can overflow int64 when the limit is huge (the server's flag takes any int64).
  int64_t tokens = 0;
  const bool overflow = __builtin_mul_overflow(rows, seq_len, &tokens);
  if (limits.max_batch_tokens > 0 && (overflow || tokens > limits.max_batch_tokens)) {
    std::ostringstream out;
    out << "server limit: the batch has " << rows << " x " << seq_len << " tokens, more than the "
        << limits.max_batch_tokens << " tokens per request this server accepts (--max-batch-tokens)";
    return Status(StatusCode::kResourceExhausted, out.str());
  }
  if (overflow) return Invalid("batch * seq_len overflows");
  if (limits.max_position_embeddings > 0 && seq_len > limits.max_position_embeddings) {
    std::ostringstream out;
    out << "seq_len " << seq_len << " is longer than the model's max_position_embeddings "
        << limits.max_position_embeddings;
    return Invalid(out.str());
  }
  return Status::Ok();
}

Status CheckBatch(const Batch& batch, const BatchLimits& limits) {
  const int64_t rows = batch.batch, seq_len = batch.seq_len;
  TIGON_RETURN_IF_ERROR(CheckBatchShape(rows, seq_len, limits));
  const int64_t tokens = rows * seq_len;
  auto check_size = [&](const char* field, size_t size, bool optional) -> Status {
    if (static_cast<int64_t>(size) == tokens || (optional && size == 0)) return Status::Ok();
    std::ostringstream out;
    out << field << " has " << size << " values; batch * seq_len = " << rows << " * " << seq_len << " = " << tokens
        << (optional ? " (or 0 for the default)" : "");
    return Invalid(out.str());
  };
  TIGON_RETURN_IF_ERROR(check_size("input_ids", batch.input_ids.size(), false));
  TIGON_RETURN_IF_ERROR(check_size("labels", batch.labels.size(), true));
  TIGON_RETURN_IF_ERROR(check_size("loss_weights", batch.loss_weights.size(), true));

  const int64_t vocab = limits.vocab_size;
  for (int64_t i = 0; i < tokens; ++i) {
    const int32_t id = batch.input_ids[i];
    if (id < 0 || id >= vocab) {
      std::ostringstream out;
      out << Position("input_ids", i, seq_len) << " = " << id << " is outside the vocabulary [0, " << vocab << ")";
      return Invalid(out.str());
    }
  }
  const bool explicit_labels = !batch.labels.empty();
  for (int64_t i = 0; explicit_labels && i < tokens; ++i) {
    const int32_t label = batch.labels[i];
    if (label != kIgnoreIndex && (label < 0 || label >= vocab)) {
      std::ostringstream out;
      out << Position("labels", i, seq_len) << " = " << label << " is outside the vocabulary [0, " << vocab
          << ") and is not the ignore index " << kIgnoreIndex;
      return Invalid(out.str());
    }
  }
  objectives::Settings objective;
  TIGON_RETURN_IF_ERROR(objectives::CheckObjectiveInputs(batch, &objective));
  // "linear" takes coefficients of any sign; every other objective weights its tokens' losses.
  const bool signed_weights = objective.kind == objectives::Kind::kLinear;
  const bool weighted = !batch.loss_weights.empty();
  for (int64_t i = 0; weighted && i < tokens; ++i) {
    const float w = batch.loss_weights[i];
    if (!std::isfinite(w) || (!signed_weights && w < 0.0f)) {
      std::ostringstream out;
      out << Position("loss_weights", i, seq_len) << " = " << w << " is not a finite value"
          << (signed_weights ? "" : " >= 0");
      return Invalid(out.str());
    }
  }
  // The loss is a weighted mean over target positions: it needs at least one with a positive weight
  // ("linear", a sum, needs one target position).
  double target_weight = 0.0;
  for (int64_t i = 0; i < tokens; ++i) {
    const bool is_target = explicit_labels ? batch.labels[i] != kIgnoreIndex : (i % seq_len) != seq_len - 1;
    if (is_target) target_weight += !weighted || signed_weights ? 1.0 : batch.loss_weights[i];
  }
  if (target_weight <= 0.0) {
    if (!explicit_labels && seq_len < 2) {
      return Invalid("the batch has no target tokens: with default labels (inputs shifted by one) seq_len must be "
                     "at least 2");
    }
    if (weighted) return Invalid("the batch has no target token with a positive loss weight");
    return Invalid("the batch has no target tokens: every label is -100");
  }
  return Status::Ok();
}

Status CheckObjectiveSplitsOverRows(const Batch& batch) {
  objectives::Settings settings;
  TIGON_RETURN_IF_ERROR(objectives::Resolve(batch.loss_fn, batch.loss_config, &settings));
  if (objectives::IsPerToken(settings.kind)) return Status::Ok();
  return Invalid("loss_fn " + ObjectiveName(batch) + " is not available on a data-parallel session: it needs every "
                 "row of the batch on one device (cross_entropy, importance_sampling, ppo and cispo are)");
}

Status CheckOptimizerSettings(const OptimizerSettings& s) {
  auto check = [](double value, bool ok, const char* name, const char* rule) -> Status {
    if (std::isfinite(value) && ok) return Status::Ok();
    std::ostringstream out;
    out << "optimizer " << name << " = " << value << " is invalid: it must be " << rule;
    return Invalid(out.str());
  };
  TIGON_RETURN_IF_ERROR(check(s.lr, s.lr >= 0, "lr", "finite and >= 0"));
  TIGON_RETURN_IF_ERROR(check(s.beta1, s.beta1 >= 0 && s.beta1 < 1, "beta1", "in [0, 1)"));
  TIGON_RETURN_IF_ERROR(check(s.beta2, s.beta2 >= 0 && s.beta2 < 1, "beta2", "in [0, 1)"));
  TIGON_RETURN_IF_ERROR(check(s.eps, s.eps > 0, "eps", "finite and > 0"));
  TIGON_RETURN_IF_ERROR(check(s.weight_decay, s.weight_decay >= 0, "weight_decay", "finite and >= 0"));
  return check(s.max_grad_norm, s.max_grad_norm >= 0, "max_grad_norm", "finite and >= 0 (0 disables clipping)");
}

Status ApplyOptimizerOverrides(const OptimizerSettings& base, const OptimizerOverrides& o, OptimizerSettings* out) {
  OptimizerSettings s = base;
  s.lr = o.lr.value_or(s.lr);
  s.beta1 = o.beta1.value_or(s.beta1);
  s.beta2 = o.beta2.value_or(s.beta2);
  s.eps = o.eps.value_or(s.eps);
  s.weight_decay = o.weight_decay.value_or(s.weight_decay);
  s.max_grad_norm = o.max_grad_norm.value_or(s.max_grad_norm);
  TIGON_RETURN_IF_ERROR(CheckOptimizerSettings(s));
  if (out != nullptr) *out = s;
  return Status::Ok();
}

Status CheckSessionChoices(const SessionOptions& options) {
  if (!OneOf(options.precision, kPrecisionNames)) {
    return Invalid("precision \"" + options.precision + "\" is not one of " + Join(kPrecisionNames));
  }
  if (!OneOf(options.kernels, kKernelChoices)) {
    return Invalid("kernels \"" + options.kernels + "\" is not one of " + Join(kKernelChoices));
  }
  for (const auto& [op, choice] : options.kernel_overrides) {
    if (op.empty()) return Invalid("kernel_overrides has an empty op name");
    if (!OneOf(choice, kKernelChoices)) {
      return Invalid("kernel_overrides[\"" + op + "\"] = \"" + choice + "\" is not one of " + Join(kKernelChoices));
    }
  }
  return CheckOptimizerSettings(options.optimizer);
}

Status CallContext::Check(const char* when) const {
  if (std::chrono::system_clock::now() >= deadline) {
    return Status(StatusCode::kDeadlineExceeded, std::string("the deadline passed ") + when + "; nothing was applied");
  }
  if (cancelled && cancelled()) {
    return Status(StatusCode::kCancelled, std::string("the call was cancelled ") + when + "; nothing was applied");
  }
  return Status::Ok();
}

}  // namespace tigon
