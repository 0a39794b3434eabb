// Inputs the fuzz targets (fuzz/) found problems with, kept as ordinary tests. Each input also stays in
// fuzz/corpus/<target>/ under the name given here.
#include "tests/models/model_test_util.h"

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
  EXPECT_NE(message.find("'num_hidden_layers' = 9000000000000000 is larger than 65536"), std::string::npos)
      << message;
  config["num_hidden_layers"] = 65536;  // the largest accepted
  EXPECT_EQ(ModelConfig::FromJson(config).sliding_window.size(), 65536u);
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
