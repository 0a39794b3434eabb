// The registered families. Adding one: write models/families/<name>.cpp defining its FamilySpec, declare
// its function below and add it to the list (models/README.md has the whole checklist).
#include <algorithm>

#include "models/families/family.h"

namespace tigon::models {

FamilySpec GemmaFamily();
FamilySpec Gemma3TextFamily();
FamilySpec LlamaFamily();
FamilySpec MistralFamily();
FamilySpec Phi3Family();
FamilySpec Qwen2Family();
FamilySpec Qwen3Family();

const std::vector<FamilySpec>& RegisteredFamilies() {
  static const std::vector<FamilySpec> kFamilies = [] {
    std::vector<FamilySpec> families = {GemmaFamily(), Gemma3TextFamily(), LlamaFamily(), MistralFamily(),
                                        Phi3Family(),  Qwen2Family(),      Qwen3Family()};
    std::sort(families.begin(), families.end(),
              [](const FamilySpec& a, const FamilySpec& b) { return a.model_type < b.model_type; });
    return families;
  }();
  return kFamilies;
}

std::vector<std::string> SupportedFamilies() {
  std::vector<std::string> names;
  for (const auto& spec : RegisteredFamilies()) names.push_back(spec.model_type);
  return names;
}

const FamilySpec& FamilyFor(const std::string& model_type) {
  for (const auto& spec : RegisteredFamilies()) {
    if (spec.model_type == model_type) return spec;
  }
  std::string supported;
  for (const auto& name : SupportedFamilies()) supported += (supported.empty() ? "" : ", ") + name;
  throw ModelError("config: unknown model_type '" + model_type + "' (supported: " + supported + ")");
}

}  // namespace tigon::models
