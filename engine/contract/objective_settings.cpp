// Each objective's inputs, settings and defaults (objective_settings.h), and the objective's part of the
// batch contract (engine.h: CheckBatch).
#include "engine/contract/objective_settings.h"

#include <cmath>
#include <sstream>
#include <vector>

namespace tigon::objectives {
namespace {

Status Invalid(const std::string& message) { return Status(StatusCode::kInvalidArgument, message); }

struct Spec {
  const char* name;
  Kind kind;
  // The LossConfig fields it takes (by name), and its defaults.
  std::vector<const char*> fields;
  Settings defaults;
};

Settings With(Kind kind, double clip_low, double clip_high, double beta, double gamma, double cpo_alpha) {
  Settings s;
  s.kind = kind;
  s.clip_low_threshold = clip_low;
  s.clip_high_threshold = clip_high;
  s.beta = beta;
  s.gamma = gamma;
  s.cpo_alpha = cpo_alpha;
  return s;
}

const std::vector<Spec>& Specs() {
  static const std::vector<Spec> specs = {
      {"cross_entropy", Kind::kCrossEntropy, {"label_smoothing", "z_loss"}, With(Kind::kCrossEntropy, 0, 0, 0, 0, 0)},
      {"linear", Kind::kLinear, {}, With(Kind::kLinear, 0, 0, 0, 0, 0)},
      {"importance_sampling", Kind::kImportanceSampling, {}, With(Kind::kImportanceSampling, 0, 0, 0, 0, 0)},
      {"ppo", Kind::kPpo, {"clip_low_threshold", "clip_high_threshold"}, With(Kind::kPpo, 0.8, 1.2, 0, 0, 0)},
      {"cispo", Kind::kCispo, {"clip_low_threshold", "clip_high_threshold"}, With(Kind::kCispo, 0.0, 4.0, 0, 0, 0)},
      {"dpo", Kind::kDpo, {"beta", "label_smoothing", "loss_type"}, With(Kind::kDpo, 0, 0, 0.1, 0, 0)},
      {"simpo", Kind::kSimpo, {"beta", "gamma", "label_smoothing"}, With(Kind::kSimpo, 0, 0, 2.0, 1.0, 0)},
      {"cpo", Kind::kCpo, {"beta", "label_smoothing", "cpo_alpha"}, With(Kind::kCpo, 0, 0, 0.1, 0, 1.0)},
      {"orpo", Kind::kOrpo, {"beta"}, With(Kind::kOrpo, 0, 0, 0.1, 0, 0)},
      {"kto", Kind::kKto, {"beta", "desirable_weight", "undesirable_weight"}, With(Kind::kKto, 0, 0, 0.1, 0, 0)},
  };
  return specs;
}

// "x[1][5]" for flat index 21 of a [batch, 16] batch.
std::string Position(const char* field, int64_t index, int64_t seq_len) {
  std::ostringstream out;
  out << field << "[" << index / seq_len << "][" << index % seq_len << "]";
  return out.str();
}

std::string Number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

Status Resolve(const std::string& loss_fn, const LossConfig& config, Settings* out) {
  const std::string name = loss_fn.empty() ? "cross_entropy" : loss_fn;
  const Spec* spec = nullptr;
  for (const auto& s : Specs()) {
    if (name == s.name) spec = &s;
  }
  if (spec == nullptr) {
    std::string names;
    for (const char* n : kObjectiveNames) names += (names.empty() ? "" : ", ") + std::string(n);
    return Invalid("loss_fn \"" + name + "\" is not one of " + names);
  }
  Settings s = spec->defaults;
  auto takes = [&](const char* field) {
    for (const char* f : spec->fields) {
      if (std::string(f) == field) return true;
    }
    return false;
  };
  // Each set field: taken by this objective, finite, in range.
  auto apply = [&](const char* field, const std::optional<double>& value, double* target, bool ok,
                   const char* rule) -> Status {
    if (!value.has_value()) return Status::Ok();
    if (!takes(field)) return Invalid("loss_config." + std::string(field) + " is not a setting of " + name);
    if (!std::isfinite(*value) || !ok) {
      return Invalid("loss_config." + std::string(field) + " = " + Number(*value) + " is invalid for " + name +
                     ": it must be " + rule);
    }
    *target = *value;
    return Status::Ok();
  };
  const auto& c = config;
  const double v_low = c.clip_low_threshold.value_or(0), v_high = c.clip_high_threshold.value_or(1);
  TIGON_RETURN_IF_ERROR(apply("clip_low_threshold", c.clip_low_threshold, &s.clip_low_threshold,
                              v_low >= 0 && v_low <= 1, "in [0, 1]"));
  TIGON_RETURN_IF_ERROR(apply("clip_high_threshold", c.clip_high_threshold, &s.clip_high_threshold, v_high >= 1,
                              ">= 1"));
  TIGON_RETURN_IF_ERROR(apply("beta", c.beta, &s.beta, c.beta.value_or(1) > 0, "> 0"));
  TIGON_RETURN_IF_ERROR(apply("gamma", c.gamma, &s.gamma, true, "finite"));
  const double smoothing = c.label_smoothing.value_or(0);
  const bool preference = spec->kind != Kind::kCrossEntropy;
  TIGON_RETURN_IF_ERROR(apply("label_smoothing", c.label_smoothing, &s.label_smoothing,
                              smoothing >= 0 && (preference ? smoothing < 0.5 : smoothing <= 1),
                              preference ? "in [0, 0.5)" : "in [0, 1]"));
  TIGON_RETURN_IF_ERROR(apply("z_loss", c.z_loss, &s.z_loss, c.z_loss.value_or(0) >= 0, ">= 0"));
  TIGON_RETURN_IF_ERROR(apply("cpo_alpha", c.cpo_alpha, &s.cpo_alpha, c.cpo_alpha.value_or(0) >= 0, ">= 0"));
  TIGON_RETURN_IF_ERROR(apply("desirable_weight", c.desirable_weight, &s.desirable_weight,
                              c.desirable_weight.value_or(0) >= 0, ">= 0"));
  TIGON_RETURN_IF_ERROR(apply("undesirable_weight", c.undesirable_weight, &s.undesirable_weight,
                              c.undesirable_weight.value_or(0) >= 0, ">= 0"));
  if (s.clip_low_threshold > s.clip_high_threshold) {
    return Invalid("loss_config.clip_low_threshold " + Number(s.clip_low_threshold) + " is above clip_high_threshold " +
                   Number(s.clip_high_threshold));
  }
  if (!c.loss_type.empty()) {
    if (!takes("loss_type")) return Invalid("loss_config.loss_type is not a setting of " + name);
    bool known = false;
    std::string types;
    for (const char* t : kDpoLossTypes) {
      known |= c.loss_type == t;
      types += (types.empty() ? "" : ", ") + std::string(t);
    }
    if (!known) return Invalid("loss_config.loss_type \"" + c.loss_type + "\" is not one of " + types);
    s.loss_type = c.loss_type;
  } else if (spec->kind == Kind::kDpo) {
    s.loss_type = "sigmoid";
  }
  if (s.loss_type != "" && s.loss_type != "sigmoid" && s.label_smoothing != 0) {
    return Invalid("loss_config.label_smoothing applies to dpo's sigmoid loss only, not to " + s.loss_type);
  }
  *out = s;
  return Status::Ok();
}

bool UsesSampler(Kind kind) {
  return kind == Kind::kImportanceSampling || kind == Kind::kPpo || kind == Kind::kCispo;
}
bool UsesReference(Kind kind) { return kind == Kind::kDpo || kind == Kind::kKto; }
bool PairsRows(Kind kind) {
  return kind == Kind::kDpo || kind == Kind::kSimpo || kind == Kind::kCpo || kind == Kind::kOrpo;
}
bool IsPerToken(Kind kind) { return kind == Kind::kCrossEntropy || UsesSampler(kind); }

// The objective's part of the batch contract: called by CheckBatch after the shapes, ids and labels
// passed (and before the weights, whose sign rule depends on the objective).
Status CheckObjectiveInputs(const Batch& batch, Settings* settings) {
  TIGON_RETURN_IF_ERROR(Resolve(batch.loss_fn, batch.loss_config, settings));
  const Kind kind = settings->kind;
  const std::string name = ObjectiveName(batch);
  const int64_t tokens = batch.batch * batch.seq_len;
  auto per_position = [&](const char* field, const std::vector<float>& values, bool used) -> Status {
    if (!used) {
      return values.empty() ? Status::Ok() : Invalid(std::string(field) + " are not used by " + name + "; leave them empty");
    }
    if (static_cast<int64_t>(values.size()) != tokens) {
      std::ostringstream out;
      out << name << " needs " << field << " for every position: " << values.size() << " values, batch * seq_len = "
          << tokens;
      return Invalid(out.str());
    }
    for (int64_t i = 0; i < tokens; ++i) {
      if (!std::isfinite(values[i])) {
        return Invalid(Position(field, i, batch.seq_len) + " = " + Number(values[i]) + " is not finite");
      }
    }
    return Status::Ok();
  };
  TIGON_RETURN_IF_ERROR(per_position("sampler_logprobs", batch.sampler_logprobs, UsesSampler(kind)));
  TIGON_RETURN_IF_ERROR(per_position("advantages", batch.advantages, UsesSampler(kind)));
  TIGON_RETURN_IF_ERROR(per_position("reference_logprobs", batch.reference_logprobs, UsesReference(kind)));
  if (kind == Kind::kKto) {
    if (static_cast<int64_t>(batch.desirable.size()) != batch.batch) {
      return Invalid("kto needs one desirable flag per row: " + std::to_string(batch.desirable.size()) +
                     " flags for " + std::to_string(batch.batch) + " rows");
    }
    for (size_t r = 0; r < batch.desirable.size(); ++r) {
      if (batch.desirable[r] > 1) {
        return Invalid("desirable[" + std::to_string(r) + "] = " + std::to_string(batch.desirable[r]) + " is not 0 or 1");
      }
    }
  } else if (!batch.desirable.empty()) {
    return Invalid("desirable flags are used by kto only, not by " + name);
  }
  const bool sequences = PairsRows(kind) || kind == Kind::kKto;
  if (!sequences) return Status::Ok();
  if (!batch.loss_weights.empty()) {
    return Invalid(name + " takes no loss_weights: leave tokens out of a row's log-probability with label -100");
  }
  if (PairsRows(kind) && batch.batch % 2 != 0) {
    return Invalid(name + " pairs rows (chosen, rejected) = (0, 1), (2, 3), ...: the batch has an odd number of rows (" +
                   std::to_string(batch.batch) + ")");
  }
  for (int64_t r = 0; r < batch.batch; ++r) {
    int64_t targets = 0;
    for (int64_t t = 0; t < batch.seq_len; ++t) {
      const int64_t i = r * batch.seq_len + t;
      targets += batch.labels.empty() ? (t != batch.seq_len - 1) : (batch.labels[i] != kIgnoreIndex);
    }
    if (targets == 0) {
      return Invalid(name + " needs at least one target token in every row; row " + std::to_string(r) + " has none");
    }
  }
  return Status::Ok();
}

}  // namespace tigon::objectives
