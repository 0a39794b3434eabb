// Which implementation (fused or Hugging Face reference) each op of a family uses.
#include <algorithm>

#include "models/model.h"

namespace tigon::models {

std::vector<std::string> OpTable::OpNames(const ModelConfig& config) {
  const std::string mlp = config.hidden_act == "gelu_pytorch_tanh" ? "geglu" : "swiglu";
  // adamw is the session's optimizer, not the decoder's: the engine reads its choice from the same table.
  return {"rms_norm", "rope", mlp, "fused_linear_cross_entropy", "adamw"};
}

namespace {
OpTable Uniform(const ModelConfig& config, OpChoice choice) {
  OpTable table;
  for (const auto& name : OpTable::OpNames(config)) table.Set(name, choice);
  return table;
}
}  // namespace

OpTable OpTable::AllFused(const ModelConfig& config) { return Uniform(config, OpChoice::kFused); }
OpTable OpTable::AllReference(const ModelConfig& config) { return Uniform(config, OpChoice::kReference); }

OpChoice OpTable::Get(const std::string& op) const {
  auto it = entries_.find(op);
  if (it == entries_.end()) {
    std::string known;
    for (const auto& [name, choice] : entries_) known += (known.empty() ? "" : ", ") + name;
    throw ModelError("op table: no entry for op '" + op + "' (has: " + known + ")");
  }
  return it->second;
}

void OpTable::Set(const std::string& op, OpChoice choice) {
  static const std::vector<std::string> kKnown = {"rms_norm", "rope", "swiglu", "geglu", "fused_linear_cross_entropy",
                                                  "adamw"};
  if (std::find(kKnown.begin(), kKnown.end(), op) == kKnown.end()) {
    throw ModelError("op table: unknown op '" + op +
                     "' (known: rms_norm, rope, swiglu, geglu, fused_linear_cross_entropy, adamw)");
  }
  entries_[op] = choice;
}

}  // namespace tigon::models
