// The safetensors reader treats the file as untrusted: every malformed header or truncated file must
// raise ModelError naming the file and the problem, never crash or allocate absurd sizes.
#include <cstring>

#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::ModelErrorMessage;
using testing::TempDir;

// Writes a safetensors file with a hand-written header and `data_bytes` bytes of data.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes, int64_t claimed_length = -1) {
  std::string bytes(8, '\0');
  const uint64_t length = claimed_length >= 0 ? static_cast<uint64_t>(claimed_length) : header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  bytes += header;
  bytes += std::string(data_bytes, '\x01');
  testing::WriteText(path, bytes);
}

TEST(Safetensors, RoundTripsEveryDtypeBitExact) {
  TempDir dir;
  std::map<std::string, torch::Tensor> tensors = {
      {"f32", torch::randn({3, 5})},
      {"bf16", torch::randn({7}).to(torch::kBFloat16)},
      {"f16", torch::randn({2, 2, 3}).to(torch::kFloat16)},
      {"i32", torch::arange(6, torch::kInt32).reshape({2, 3})},
      {"i64", torch::tensor(std::vector<int64_t>{-1, 5, int64_t{1} << 40}, torch::kInt64)},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::randn({4, 6}).t()},  // non-contiguous input is written in logical order
  };
  WriteSafetensors(dir / "t.safetensors", tensors, {{"format", "pt"}});
  const auto loaded = ReadSafetensors(dir / "t.safetensors");
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const auto& got = loaded.at(name);
    EXPECT_EQ(got.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, tensor)) << name;
  }
  const auto header = ReadSafetensorsHeader(dir / "t.safetensors");
  EXPECT_EQ(header.at("bf16").first, "BF16");
  EXPECT_EQ(header.at("f32").second, (std::vector<int64_t>{3, 5}));
  // The data section starts 8-byte aligned.
  const std::string bytes = testing::ReadText(dir / "t.safetensors");
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  EXPECT_EQ(length % 8, 0u);
}

TEST(Safetensors, ReadsFilesWrittenByHuggingFace) {
  const auto header = ReadSafetensorsHeader(testing::FixtureDir("llama") + "/model.safetensors");
  EXPECT_EQ(header.at("model.embed_tokens.weight").first, "F32");
  EXPECT_EQ(header.at("model.embed_tokens.weight").second, (std::vector<int64_t>{128, 32}));
}

TEST(Safetensors, MissingFile) {
  const auto message = ModelErrorMessage([] { ReadSafetensors("/nonexistent/x.safetensors"); });
  EXPECT_NE(message.find("/nonexistent/x.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot open"), std::string::npos) << message;
}

TEST(Safetensors, FileShorterThanLengthPrefix) {
  TempDir dir;
  testing::WriteText(dir / "short.safetensors", "abc");
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "short.safetensors"); });
  EXPECT_NE(message.find("short.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST(Safetensors, HeaderLengthPastEndOfFile) {
  TempDir dir;
  WriteRaw(dir / "h.safetensors", "{}", 0, /*claimed_length=*/1000);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "h.safetensors"); });
  EXPECT_NE(message.find("header length 1000"), std::string::npos) << message;
  EXPECT_NE(message.find("past the end"), std::string::npos) << message;
  // An absurd length (2^63) does not allocate; it is refused the same way.
  WriteRaw(dir / "h2.safetensors", "{}", 0, /*claimed_length=*/INT64_MAX);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "h2.safetensors"); }).find("past the end"),
            std::string::npos);
}

TEST(Safetensors, MalformedHeaderJson) {
  TempDir dir;
  WriteRaw(dir / "j.safetensors", R"({"a": {"dtype": "F32", "shape": [1], )", 4);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "j.safetensors"); });
  EXPECT_NE(message.find("malformed header JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("parse error"), std::string::npos) << message;  // nlohmann's parse error text
  WriteRaw(dir / "arr.safetensors", "[1, 2]", 0);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "arr.safetensors"); }).find("JSON object"),
            std::string::npos);
}

TEST(Safetensors, UnknownDtype) {
  TempDir dir;
  WriteRaw(dir / "d.safetensors", R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", 4);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "d.safetensors"); });
  EXPECT_NE(message.find("tensor 'w'"), std::string::npos) << message;
  EXPECT_NE(message.find("unknown dtype 'F8_E4M3'"), std::string::npos) << message;
}

TEST(Safetensors, OffsetsDoNotMatchDtypeAndShape) {
  TempDir dir;
  WriteRaw(dir / "m.safetensors", R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "m.safetensors"); });
  EXPECT_NE(message.find("tensor 'w'"), std::string::npos) << message;
  EXPECT_NE(message.find("span 20 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("needs 24"), std::string::npos) << message;
  WriteRaw(dir / "r.safetensors", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "r.safetensors"); }).find("end before they begin"),
            std::string::npos);
}

TEST(Safetensors, OverlappingOffsets) {
  TempDir dir;
  WriteRaw(dir / "o.safetensors",
           R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
           12);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "o.safetensors"); });
  EXPECT_NE(message.find("overlapping"), std::string::npos) << message;
  EXPECT_NE(message.find("'a'"), std::string::npos) << message;
  EXPECT_NE(message.find("'b'"), std::string::npos) << message;
}

TEST(Safetensors, HugeShapeOverflows) {
  TempDir dir;
  WriteRaw(dir / "s.safetensors",
           R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})", 4);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "s.safetensors"); });
  EXPECT_NE(message.find("tensor 'w'"), std::string::npos) << message;
  EXPECT_NE(message.find("overflows"), std::string::npos) << message;
  // Fits in 64 bits as elements but not as bytes.
  WriteRaw(dir / "b.safetensors", R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 8]}})",
           8);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "b.safetensors"); }).find("overflows"), std::string::npos);
  // Negative dimensions are refused too.
  WriteRaw(dir / "n.safetensors", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "n.safetensors"); }).find("non-negative"), std::string::npos);
}

TEST(Safetensors, OffsetsOutOfRange) {
  TempDir dir;
  // A huge but self-consistent U8 tensor that the file does not hold: refused before any allocation.
  WriteRaw(dir / "big.safetensors",
           R"({"w": {"dtype": "U8", "shape": [1099511627776], "data_offsets": [0, 1099511627776]}})", 16);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "big.safetensors"); });
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
}

TEST(Safetensors, TruncatedFile) {
  TempDir dir;
  const std::string bytes = testing::ReadText(testing::FixtureDir("llama") + "/model.safetensors");
  testing::WriteText(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 100));
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "cut.safetensors"); });
  EXPECT_NE(message.find("cut.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  // Cut inside the header.
  testing::WriteText(dir / "cut2.safetensors", bytes.substr(0, 100));
  EXPECT_NE(ModelErrorMessage([&] { ReadSafetensors(dir / "cut2.safetensors"); }).find("past the end"),
            std::string::npos);
}

TEST(Safetensors, EntryWithoutRequiredFields) {
  TempDir dir;
  WriteRaw(dir / "e.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  const auto message = ModelErrorMessage([&] { ReadSafetensors(dir / "e.safetensors"); });
  EXPECT_NE(message.find("data_offsets"), std::string::npos) << message;
}

}  // namespace
}  // namespace tigon::models
