// Inputs the fuzz targets (fuzz/) found problems with, kept as ordinary tests. Each input also stays in
// fuzz/corpus/<target>/ under the name given here.
#include "tests/models/model_test_util.h"

#include "common/bounded_json.h"
#include "models/safetensors.h"

namespace tigon::models {
namespace {

using testing::ModelErrorMessage;

nlohmann::json TinyConfig(const std::string& family) {
  return {{"model_type", family},       {"vocab_size", 256},        {"hidden_size", 64},
          {"intermediate_size", 128},   {"num_hidden_layers", 3},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

// fuzz/corpus/fuzz_config/crash_huge_num_hidden_layers: num_hidden_layers = 9e15 made FromJson allocate
// one sliding-window entry per layer (72 PB: std::bad_alloc, which the engine reported as INTERNAL).
TEST(FuzzRegressions, AbsurdLayerCountIsAConfigError) {
  nlohmann::json config = TinyConfig("llama");
  config["num_hidden_layers"] = 9000000000000000LL;
  const std::string message = ModelErrorMessage([&] { ModelConfig::FromJson(config); });
  EXPECT_NE(message.find("'num_hidden_layers' = 9000000000000000 is larger than 1024"), std::string::npos)
      << message;
  config["num_hidden_layers"] = 1024;  // the largest accepted
  EXPECT_EQ(ModelConfig::FromJson(config).sliding_window.size(), 1024u);
}

// Each size has a cap far past released models, and the cap itself is accepted: an attack's 2^31 - 2
// head_dim (19 GiB of RSS in a minute) and 65,536 thin layers (37 s for a 4-token step) are config errors.
TEST(FuzzRegressions, EverySizeHasACapItselfAccepted) {
  const struct {
    const char* key;
    int64_t cap;
  } caps[] = {{"vocab_size", int64_t{1} << 22}, {"hidden_size", int64_t{1} << 16},
              {"intermediate_size", int64_t{1} << 18}, {"num_hidden_layers", 1024},
              {"head_dim", 1024}, {"max_position_embeddings", int64_t{1} << 26}};
  for (const auto& [key, cap] : caps) {
    nlohmann::json config = TinyConfig("llama");
    config["head_dim"] = 16;  // so that a wide hidden_size leaves the heads as they are
    config[key] = cap;
    EXPECT_NO_THROW(ModelConfig::FromJson(config)) << key << " = " << cap;
    config[key] = cap + 1;
    const std::string message = ModelErrorMessage([&] { ModelConfig::FromJson(config); });
    EXPECT_NE(message.find(std::string("'") + key + "' = " + std::to_string(cap + 1) + " is larger than " +
                           std::to_string(cap)),
              std::string::npos)
        << message;
  }
  nlohmann::json heads = TinyConfig("llama");
  heads["hidden_size"] = 2048;
  heads["num_attention_heads"] = 1024;
  heads["num_key_value_heads"] = 1024;
  EXPECT_NO_THROW(ModelConfig::FromJson(heads));
  heads["num_attention_heads"] = 2048;
  EXPECT_NE(ModelErrorMessage([&] { ModelConfig::FromJson(heads); }).find("num_attention_heads"), std::string::npos);
}

// A non-positive max_position_embeddings turned the sequence-length check off (a 4,096-token step ran on
// a model whose limit was 0); absent, it is 2048.
TEST(FuzzRegressions, MaxPositionEmbeddingsMustBePositive) {
  for (int64_t limit : {int64_t{0}, int64_t{-1}, int64_t{-4096}}) {
    nlohmann::json config = TinyConfig("llama");
    config["max_position_embeddings"] = limit;
    const std::string message = ModelErrorMessage([&] { ModelConfig::FromJson(config); });
    EXPECT_NE(message.find("'max_position_embeddings' must be positive"), std::string::npos) << message;
  }
  EXPECT_EQ(ModelConfig::FromJson(TinyConfig("llama")).max_position_embeddings, 2048);
}

// fuzz/corpus/fuzz_config/deep_nesting_config: 100,000 levels of arrays in a config field overflowed the
// stack in FromJson's copy of the value (the server died). The bounded parse refuses it; a value that
// got past a parse some other way is still refused by nothing here, so every parse of outside JSON goes
// through common/bounded_json.h.
TEST(FuzzRegressions, DeepNestingIsRefusedByTheParse) {
  const std::string deep = R"({"model_type": "llama", "x": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  try {
    ParseBoundedJson(deep);
    ADD_FAILURE() << "100,000 levels were parsed";
  } catch (const JsonInputError& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos) << e.what();
  }
  const std::string ok = R"({"x": )" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_EQ(ParseBoundedJson(ok)["x"].size(), 1u);
  std::string error;
  EXPECT_TRUE(ParseBoundedJsonOrDiscard("{not json", &error).is_discarded());
  EXPECT_FALSE(error.empty());
}

// Sizes past int32 (token ids are int32) would overflow the products the model is built from.
TEST(FuzzRegressions, SizesPastInt32AreConfigErrors) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_attention_heads"}) {
    nlohmann::json config = TinyConfig("llama");
    config[key] = 9223372036854757808ULL;
    const std::string message = ModelErrorMessage([&] { ModelConfig::FromJson(config); });
    EXPECT_NE(message.find(key), std::string::npos) << message;
  }
}

// fuzz/corpus/fuzz_config/crash_negative_max_window_layers: a Qwen2 config with use_sliding_window and
// a negative max_window_layers wrote before the start of the per-layer window vector (heap overflow).
// Transformers treats layers with index >= max_window_layers as sliding, so every layer slides.
TEST(FuzzRegressions, NegativeMaxWindowLayersMakesEveryLayerSliding) {
  nlohmann::json config = TinyConfig("qwen2");
  config["use_sliding_window"] = true;
  config["sliding_window"] = 16;
  config["max_window_layers"] = -5;
  EXPECT_EQ(ModelConfig::FromJson(config).sliding_window, (std::vector<int64_t>{16, 16, 16}));
  config["max_window_layers"] = 2;
  EXPECT_EQ(ModelConfig::FromJson(config).sliding_window, (std::vector<int64_t>{0, 0, 16}));
}

// fuzz/corpus/fuzz_safetensors/crash_number_overflow_in_header: a number too large for a double in the
// header JSON made the parser throw nlohmann's out_of_range, which escaped the reader (only parse errors
// were turned into ModelError) and would have reached the caller as an internal error.
TEST(FuzzRegressions, SafetensorsHeaderNumberOverflowIsAModelError) {
  const std::string header = "{\"a\": {\"dtype\": \"F32\", \"shape\": [1e999], \"data_offsets\": [0, 4]}}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header + std::string(4, '\0');
  const std::string message =
      ModelErrorMessage([&] { ReadSafetensorsFromMemory(bytes.data(), bytes.size(), "overflow.safetensors"); });
  EXPECT_NE(message.find("overflow.safetensors: malformed header JSON"), std::string::npos) << message;
}

// The buffer entry point refuses what the file reader refuses, with the name in place of the path.
TEST(FuzzRegressions, SafetensorsFromMemoryChecksLikeTheFileReader) {
  std::string bytes = std::string("\x10\0\0\0\0\0\0\0", 8) + "{\"a\": 1}";
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensorsFromMemory(bytes.data(), bytes.size(), "m.safetensors"); })
                .find("m.safetensors: header length 16 runs past the end"),
            std::string::npos);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensorsFromMemory(bytes.data(), 3, "m.safetensors"); }).find("truncated"),
            std::string::npos);
}

}  // namespace
}  // namespace tigon::models
