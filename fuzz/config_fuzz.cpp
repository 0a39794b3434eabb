// Fuzzes config.json -> ModelConfig. Contract (models/model.h): any JSON either yields a config whose
// sizes are positive and consistent, or throws ModelError naming the field; no other exception (the
// engine maps ModelError to INVALID_ARGUMENT and anything else to INTERNAL), no huge allocation.
#include <cstddef>
#include <cstdint>

#include <string_view>

#include "common/bounded_json.h"
#include "fuzz/fuzz_check.h"
#include "models/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The server's parse: deep nesting is refused here, so what follows may recurse over the value (the
  // corpus's deep_nesting_* seeds overflowed the stack in FromJson's copy before the bound).
  const nlohmann::json json =
      tigon::ParseBoundedJsonOrDiscard(std::string_view(reinterpret_cast<const char*>(data), size));
  if (json.is_discarded()) return 0;
  FUZZ_CHECK(!json.dump().empty(), "an accepted value dumps to nothing");
  tigon::models::ModelConfig config;
  try {
    config = tigon::models::ModelConfig::FromJson(json);
  } catch (const tigon::models::ModelError&) {
    return 0;
  }
  FUZZ_CHECK(config.vocab_size > 0 && config.hidden_size > 0 && config.intermediate_size > 0, "sizes not positive");
  FUZZ_CHECK(config.num_hidden_layers > 0 && config.num_attention_heads > 0 && config.num_key_value_heads > 0,
             "counts not positive");
  FUZZ_CHECK(config.num_attention_heads % config.num_key_value_heads == 0, "heads not a multiple of kv heads");
  FUZZ_CHECK(config.head_dim > 0, "head_dim %lld", static_cast<long long>(config.head_dim));
  FUZZ_CHECK(static_cast<int64_t>(config.sliding_window.size()) == config.num_hidden_layers,
             "sliding_window has %zu entries for %lld layers", config.sliding_window.size(),
             static_cast<long long>(config.num_hidden_layers));
  for (int64_t window : config.sliding_window) FUZZ_CHECK(window >= 0, "negative window %lld", (long long)window);
  // What is written back on save must read back to the same model.
  tigon::models::ModelConfig again;
  try {
    again = tigon::models::ModelConfig::FromJson(config.ToJson());
  } catch (const tigon::models::ModelError& e) {
    FUZZ_CHECK(false, "ToJson of an accepted config is refused: %s", e.what());
  }
  FUZZ_CHECK(again.family == config.family && again.vocab_size == config.vocab_size &&
                 again.hidden_size == config.hidden_size && again.num_hidden_layers == config.num_hidden_layers &&
                 again.head_dim == config.head_dim && again.sliding_window == config.sliding_window,
             "ToJson/FromJson round trip changed the model");
  return 0;
}
