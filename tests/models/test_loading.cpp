// Loading Hugging Face folders (single file and sharded), saving, random initialisation, config parsing,
// and the errors bad folders, configs and batches must produce.
#include <cmath>
#include <filesystem>

#include "models/rotary.h"
#include "tests/models/model_test_util.h"

namespace tigon::models {
namespace {

using testing::CopyFixture;
using testing::FixtureDir;
using testing::ModelErrorMessage;
using testing::TempDir;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

void ExpectSameParameters(const DecoderModel& a, const DecoderModel& b) {
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i].name, b.parameters()[i].name);
    EXPECT_EQ(a.parameters()[i].tensor.scalar_type(), b.parameters()[i].tensor.scalar_type());
    EXPECT_TRUE(torch::equal(a.parameters()[i].tensor, b.parameters()[i].tensor)) << a.parameters()[i].name;
  }
}

// --- Loading, sharding, saving ---------------------------------------------------------------------

TEST(Loading, ParameterNamesAndCountsMatchTheCheckpoint) {
  for (const auto& family : testing::Families()) {
    auto model = LoadPretrained(FixtureDir(family), nullptr, torch::kFloat32, torch::kCPU);
    const auto header = ReadSafetensorsHeader(FixtureDir(family) + "/model.safetensors");
    EXPECT_EQ(model->parameters().size(), header.size()) << family;
    for (const auto& p : model->parameters()) {
      ASSERT_TRUE(header.count(p.name)) << family << " " << p.name;
      EXPECT_EQ(p.tensor.sizes().vec(), header.at(p.name).second) << p.name;
      EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
    }
  }
}

TEST(Loading, ShardedCheckpointEqualsSingleFile) {
  TempDir dir;
  testing::WriteText(dir / "config.json", testing::ReadText(FixtureDir("qwen2") + "/config.json"));
  const auto tensors = ReadSafetensors(FixtureDir("qwen2") + "/model.safetensors");
  // Three shards, names dealt round-robin so every shard mixes layers.
  std::vector<std::map<std::string, torch::Tensor>> shards(3);
  nlohmann::json weight_map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& [name, tensor] : tensors) {
    const size_t shard = i++ % shards.size();
    shards[shard][name] = tensor;
    weight_map[name] = "model-0000" + std::to_string(shard + 1) + "-of-00003.safetensors";
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    WriteSafetensors(dir / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors"), shards[s]);
  }
  testing::WriteText(dir / "model.safetensors.index.json",
                     nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());

  auto single = LoadPretrained(FixtureDir("qwen2"), nullptr, torch::kFloat32, torch::kCPU);
  auto sharded = LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU);
  ExpectSameParameters(*single, *sharded);
  const auto expected = ReadSafetensors(FixtureDir("qwen2") + "/expected.safetensors");
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(single->Logits(expected.at("input_ids")), sharded->Logits(expected.at("input_ids"))));

  // A shard that lacks a tensor the index assigns to it.
  auto first = weight_map.begin();
  const std::string moved = first.key();
  weight_map[moved] = "model-00002-of-00003.safetensors";
  if (shards[1].count(moved)) weight_map[moved] = "model-00003-of-00003.safetensors";
  testing::WriteText(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  std::string message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "does not contain tensor '" + moved + "'")) << message;

  // A shard that does not exist, and one outside the folder.
  weight_map[moved] = "model-00009-of-00009.safetensors";
  testing::WriteText(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "model-00009-of-00009.safetensors")) << message;
  EXPECT_TRUE(Contains(message, "does not exist")) << message;
  weight_map[moved] = "../elsewhere.safetensors";
  testing::WriteText(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());
  message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "inside the folder")) << message;
  testing::WriteText(dir / "model.safetensors.index.json", "{\"weight_map\": 3}");
  message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "weight_map")) << message;
}

TEST(Loading, SaveThenLoadIsBitExact) {
  for (const auto& family : testing::Families()) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      TempDir dir;
      auto original = LoadPretrained(FixtureDir(family), nullptr, dtype, torch::kCPU);
      SavePretrained(*original, dir.path());
      EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.tmp"));
      auto reloaded = LoadPretrained(dir.path(), nullptr, dtype, torch::kCPU);
      ExpectSameParameters(*original, *reloaded);
      // The file holds the model's dtype, and the config says so; tied lm_head is not written.
      const auto header = ReadSafetensorsHeader(dir / "model.safetensors");
      EXPECT_EQ(header.at("model.norm.weight").first, dtype == torch::kFloat32 ? "F32" : "BF16");
      EXPECT_EQ(header.count("lm_head.weight"), original->config().tie_word_embeddings ? 0u : 1u);
      const auto config = nlohmann::json::parse(testing::ReadText(dir / "config.json"));
      EXPECT_EQ(config.at("dtype"), dtype == torch::kFloat32 ? "float32" : "bfloat16");
      EXPECT_EQ(config.at("model_type"), family);
      const ModelConfig a = original->config(), b = reloaded->config();
      EXPECT_EQ(a.rope_theta, b.rope_theta);
      EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
      EXPECT_EQ(a.head_dim, b.head_dim);
      EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
      EXPECT_EQ(a.attention_bias, b.attention_bias);
      EXPECT_EQ(a.hidden_act, b.hidden_act);
    }
  }
}

TEST(Loading, RandomInitIsDeterministicAndHuggingFaceLike) {
  for (const auto& family : testing::Families()) {
    nlohmann::json config = testing::ReadConfig(family);
    auto a = CreateRandom(config, nullptr, 7, torch::kFloat32, torch::kCPU);
    auto b = CreateRandom(config, nullptr, 7, torch::kFloat32, torch::kCPU);
    auto c = CreateRandom(config, nullptr, 8, torch::kFloat32, torch::kCPU);
    ExpectSameParameters(*a, *b);
    EXPECT_FALSE(torch::equal(a->parameters().front().tensor, c->parameters().front().tensor));
    // bf16 gets the fp32 draw rounded: the same weights whatever the dtype (and device).
    auto half = CreateRandom(config, nullptr, 7, torch::kBFloat16, torch::kCPU);
    for (size_t i = 0; i < a->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(a->parameters()[i].tensor.to(torch::kBFloat16), half->parameters()[i].tensor));
    }
    const double range = config.at("initializer_range").get<double>();
    const double identity = 1.0 - a->config().traits.norm_offset;  // (offset + weight) starts at 1
    for (const auto& [name, tensor] : a->parameters()) {
      if (Contains(name, "norm")) {
        EXPECT_TRUE(torch::all(tensor == identity).item<bool>()) << name;
      } else if (Contains(name, ".bias")) {
        EXPECT_TRUE(torch::all(tensor == 0).item<bool>()) << name;
      } else {
        // Five standard errors of the sample mean (range / sqrt(n)) and of the sample std (range / sqrt(2n)).
        const double n = static_cast<double>(tensor.numel());
        EXPECT_NEAR(tensor.std().item<double>(), range, 5 * range / std::sqrt(2 * n)) << name;
        EXPECT_NEAR(tensor.mean().item<double>(), 0.0, 5 * range / std::sqrt(n)) << name;
      }
    }
  }
  // Without initializer_range the default is 0.02.
  nlohmann::json config = testing::ReadConfig("llama");
  config.erase("initializer_range");
  auto model = CreateRandom(config, nullptr, 1, torch::kFloat32, torch::kCPU);
  EXPECT_NEAR(model->parameter("model.embed_tokens.weight").std().item<double>(), 0.02, 0.002);
}

TEST(Loading, RandomInitDrawsEveryChunkOfLargeTensorsOnSeveralThreads) {
  // An embedding of 8.4M values spans 9 chunks of 2^20 draws, taken by several threads: every chunk must
  // be drawn (none left uninitialised, none drawn twice with the same generator), the same on every run.
  nlohmann::json config = testing::ReadConfig("llama");
  config["vocab_size"] = 32771;  // not a multiple of the chunk: the last chunk is partial
  config["hidden_size"] = 256;
  config["head_dim"] = 256 / config.at("num_attention_heads").get<int64_t>();
  auto a = CreateRandom(config, nullptr, 3, torch::kFloat32, torch::kCPU);
  auto b = CreateRandom(config, nullptr, 3, torch::kFloat32, torch::kCPU);
  ExpectSameParameters(*a, *b);
  const torch::Tensor embed = a->parameter("model.embed_tokens.weight").flatten();
  ASSERT_GT(embed.numel(), 8 << 20);
  const double range = config.at("initializer_range").get<double>();
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<torch::Tensor> firsts;
  for (int64_t start = 0; start < embed.numel(); start += kChunk) {
    const torch::Tensor chunk = embed.narrow(0, start, std::min(kChunk, embed.numel() - start));
    const double n = static_cast<double>(chunk.numel());
    EXPECT_NEAR(chunk.std().item<double>(), range, 5 * range / std::sqrt(2 * n)) << "chunk at " << start;
    firsts.push_back(chunk.narrow(0, 0, 16));
  }
  for (size_t i = 1; i < firsts.size(); ++i)  // each chunk has its own generator
    EXPECT_FALSE(torch::equal(firsts[i], firsts[0])) << "chunk " << i;
}

TEST(Loading, CreateRandomModelTrainsThroughBothTables) {
  // A tiny step on each table moves the loss down: the backward graph reaches every parameter.
  nlohmann::json config = testing::ReadConfig("phi3");
  for (const bool fused : {false, true}) {
    const ModelConfig parsed = ModelConfig::FromJson(config);
    const OpTable table = fused ? OpTable::AllFused(parsed) : OpTable::AllReference(parsed);
    auto model = CreateRandom(config, &table, 3, torch::kFloat32, torch::kCPU);
    const torch::Tensor ids = torch::randint(3, 128, {2, 12}, torch::kInt64);
    const torch::Tensor labels = torch::cat({ids.narrow(1, 1, 11), torch::full({2, 1}, -100, torch::kInt64)}, 1);
    const torch::Tensor before = model->LossSum(ids, labels, {});
    before.backward();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_GT(p.tensor.grad().abs().sum().item<double>(), 0) << p.name;
      p.tensor.sub_(1e-3 * p.tensor.grad());
    }
    EXPECT_LT(model->LossSum(ids, labels, {}).item<double>(), before.item<double>());
  }
}

// A model.safetensors holding the fixture's tensors and an extra 1 TiB F32 tensor whose bytes are a
// hole at the end of a sparse file. Loading reads only the model's parameters: allocating or reading the
// extra one would fail (more than the machine's memory) or take hours.
TEST(Loading, TensorsTheModelDoesNotUseAreNeitherAllocatedNorRead) {
  TempDir dir;
  CopyFixture("llama", dir);
  const auto tensors = ReadSafetensors(dir / "model.safetensors");
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(tensor.scalar_type(), torch::kFloat32) << name;
    const torch::Tensor cpu = tensor.contiguous();
    const size_t begin = data.size();
    data.append(static_cast<const char*>(cpu.data_ptr()), cpu.numel() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", cpu.sizes().vec()}, {"data_offsets", {begin, data.size()}}};
  }
  const uint64_t huge_elements = uint64_t{1} << 38;  // 1 TiB of float32
  header["unused.huge"] = {{"dtype", "F32"},
                           {"shape", {huge_elements}},
                           {"data_offsets", {data.size(), data.size() + huge_elements * 4}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  testing::WriteText(dir / "model.safetensors", bytes + text + data);
  std::filesystem::resize_file(dir / "model.safetensors", 8 + text.size() + data.size() + huge_elements * 4);
  ASSERT_EQ(ReadSafetensorsHeader(dir / "model.safetensors").count("unused.huge"), 1u) << "a valid file";

  auto model = LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU);
  auto reference = LoadPretrained(FixtureDir("llama"), nullptr, torch::kFloat32, torch::kCPU);
  ExpectSameParameters(*model, *reference);
  const auto some = ReadSafetensors(dir / "model.safetensors", {"model.norm.weight", "absent"});
  ASSERT_EQ(some.size(), 1u);
  EXPECT_TRUE(torch::equal(some.at("model.norm.weight"), tensors.at("model.norm.weight")));
}

// --- Bad folders, checkpoints and configs ----------------------------------------------------------

TEST(LoadingErrors, MissingTensor) {
  TempDir dir;
  CopyFixture("llama", dir);
  auto tensors = ReadSafetensors(dir / "model.safetensors");
  tensors.erase("model.layers.1.mlp.up_proj.weight");
  WriteSafetensors(dir / "model.safetensors", tensors);
  const auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "missing")) << message;
  EXPECT_TRUE(Contains(message, "model.layers.1.mlp.up_proj.weight")) << message;
  EXPECT_TRUE(Contains(message, "model.safetensors")) << message;
}

TEST(LoadingErrors, WrongShape) {
  TempDir dir;
  CopyFixture("mistral", dir);
  auto tensors = ReadSafetensors(dir / "model.safetensors");
  tensors["model.layers.0.self_attn.k_proj.weight"] = torch::zeros({8, 32});
  WriteSafetensors(dir / "model.safetensors", tensors);
  const auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "model.layers.0.self_attn.k_proj.weight")) << message;
  EXPECT_TRUE(Contains(message, "expected shape [16, 32]")) << message;
  EXPECT_TRUE(Contains(message, "got [8, 32]")) << message;
}

TEST(LoadingErrors, TruncatedCheckpoint) {
  TempDir dir;
  CopyFixture("gemma", dir);
  const std::string bytes = testing::ReadText(dir / "model.safetensors");
  testing::WriteText(dir / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  const auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "model.safetensors")) << message;
  EXPECT_TRUE(Contains(message, "truncated")) << message;
}

TEST(LoadingErrors, NoWeightsOrNoConfigOrNoFolder) {
  TempDir dir;
  testing::WriteText(dir / "config.json", testing::ReadText(FixtureDir("llama") + "/config.json"));
  auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "no model.safetensors or model.safetensors.index.json")) << message;
  std::filesystem::remove(dir / "config.json");
  message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "no config.json")) << message;
  message = ModelErrorMessage([&] { LoadPretrained(dir / "absent", nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "not a directory")) << message;
  message = ModelErrorMessage([&] { LoadPretrained(FixtureDir("llama"), nullptr, torch::kInt32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "float32, bfloat16 or float16")) << message;
}

TEST(LoadingErrors, MalformedConfigJson) {
  TempDir dir;
  CopyFixture("llama", dir);
  testing::WriteText(dir / "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 32,,}");
  const auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  EXPECT_TRUE(Contains(message, "config.json")) << message;
  EXPECT_TRUE(Contains(message, "malformed JSON")) << message;
  EXPECT_TRUE(Contains(message, "parse error")) << message;
}

TEST(LoadingErrors, UnknownModelType) {
  TempDir dir;
  CopyFixture("llama", dir);
  nlohmann::json config = testing::ReadConfig("llama");
  config["model_type"] = "xyz";
  testing::WriteText(dir / "config.json", config.dump());
  const auto message = ModelErrorMessage([&] { LoadPretrained(dir.path(), nullptr, torch::kFloat32, torch::kCPU); });
  std::string supported;
  for (const auto& family : SupportedFamilies()) supported += (supported.empty() ? "" : ", ") + family;
  for (const char* family : {"gemma", "llama", "mistral", "phi3", "qwen2"}) EXPECT_TRUE(Contains(supported, family));
  EXPECT_TRUE(Contains(message, "unknown model_type 'xyz' (supported: " + supported + ")")) << message;
}

TEST(ConfigErrors, MissingOrInvalidFields) {
  for (const char* field :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "model_type"}) {
    nlohmann::json config = testing::ReadConfig("qwen2");
    config.erase(field);
    const auto message = ModelErrorMessage([&] { ModelConfig::FromJson(config); });
    EXPECT_TRUE(Contains(message, "missing required field '" + std::string(field) + "'")) << message;
  }
  nlohmann::json config = testing::ReadConfig("llama");
  config["hidden_size"] = "32";
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }),
                       "field 'hidden_size' must be an integer, got string"));
  config = testing::ReadConfig("llama");
  config["num_key_value_heads"] = 3;
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }), "multiple of num_key_value_heads"));
  config = testing::ReadConfig("llama");
  config["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }), "unsupported rope type 'yarn'"));
  config = testing::ReadConfig("llama");
  config["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }), "original_max_position_embeddings"));
  config = testing::ReadConfig("llama");
  config["hidden_act"] = "relu";
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }), "unsupported activation 'relu'"));
  config = testing::ReadConfig("llama");
  config["vocab_size"] = 0;
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(config); }), "'vocab_size' must be positive"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { ModelConfig::FromJson(nlohmann::json::array()); }), "JSON object"));
}

// --- Bad batches -----------------------------------------------------------------------------------

// The values of ids and labels are the batch contract's (tigon::CheckBatch, tests/engine); the model
// checks only what needs no look at them (no device sync).
TEST(BatchErrors, ShapesAndDtypesAreChecked) {
  auto model = LoadPretrained(FixtureDir("llama"), nullptr, torch::kFloat32, torch::kCPU);
  torch::Tensor ids = torch::randint(0, 128, {2, 5}, torch::kInt64);
  const torch::Tensor labels = torch::zeros({2, 5}, torch::kInt64);
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { model->LossSum(ids, labels.narrow(1, 0, 4), {}); }), "does not match"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { model->LossSum(ids, labels, torch::ones({2, 4})); }), "loss_weights"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { model->Logits(ids.to(torch::kFloat32)); }), "integer token ids"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { model->Logits(ids.flatten()); }), "[batch, seq_len]"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { model->TokenLogProbs(ids, labels.to(torch::kFloat32)); }),
                       "integer token ids"));
}

TEST(OpTableTest, NamesPerFamilyAndUnknownOps) {
  const auto llama = ModelConfig::FromJson(testing::ReadConfig("llama"));
  const auto gemma = ModelConfig::FromJson(testing::ReadConfig("gemma"));
  EXPECT_EQ(OpTable::OpNames(llama),
            (std::vector<std::string>{"rms_norm", "rope", "swiglu", "fused_linear_cross_entropy", "adamw"}));
  EXPECT_EQ(OpTable::OpNames(gemma),
            (std::vector<std::string>{"rms_norm", "rope", "geglu", "fused_linear_cross_entropy", "adamw"}));
  OpTable table = OpTable::AllFused(llama);
  EXPECT_EQ(table.Get("swiglu"), OpChoice::kFused);
  table.Set("rope", OpChoice::kReference);
  EXPECT_EQ(table.Get("rope"), OpChoice::kReference);
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { table.Set("flash", OpChoice::kFused); }), "unknown op 'flash'"));
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { table.Get("geglu"); }), "no entry for op 'geglu'"));
  // A llama table lacks geglu, so a gemma model refuses it.
  EXPECT_TRUE(Contains(ModelErrorMessage([&] { DecoderModel(gemma, table); }), "geglu"));
}

// Llama's attention_bias puts biases on q/k/v and o_proj, mlp_bias on gate/up/down (Hugging Face names
// and shapes); a non-zero o_proj bias reaches the logits.
TEST(ConfigParsing, LlamaAttentionAndMlpBiases) {
  nlohmann::json config = testing::ReadConfig("llama");
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  auto model = CreateRandom(config, nullptr, 2, torch::kFloat32, torch::kCPU);
  const std::map<std::string, int64_t> biases = {{"self_attn.q_proj.bias", 32}, {"self_attn.k_proj.bias", 16},
                                                 {"self_attn.v_proj.bias", 16}, {"self_attn.o_proj.bias", 32},
                                                 {"mlp.gate_proj.bias", 64},    {"mlp.up_proj.bias", 64},
                                                 {"mlp.down_proj.bias", 32}};
  for (const auto& [name, size] : biases) {
    EXPECT_EQ(model->parameter("model.layers.1." + name).sizes().vec(), std::vector<int64_t>{size}) << name;
  }
  EXPECT_EQ(model->parameters().size(), 3 + 2 * (9 + biases.size()));
  const torch::Tensor ids = torch::randint(0, 128, {1, 6}, torch::kInt64);
  torch::NoGradGuard no_grad;
  const torch::Tensor before = model->Logits(ids);
  model->parameter("model.layers.0.self_attn.o_proj.bias").fill_(0.5);
  EXPECT_FALSE(torch::allclose(model->Logits(ids), before));
}

// With non-zero biases everywhere, the fused table (fused norms, rope, glu_linear MLP with its bias, FLCE)
// gives the reference table's loss and gradients.
TEST(ConfigParsing, BiasedLlamaFusedMatchesReference) {
  nlohmann::json config = testing::ReadConfig("llama");
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  const ModelConfig parsed = ModelConfig::FromJson(config);
  const OpTable fused_table = OpTable::AllFused(parsed), reference_table = OpTable::AllReference(parsed);
  auto fused = CreateRandom(config, &fused_table, 4, torch::kFloat32, torch::kCPU);
  auto reference = CreateRandom(config, &reference_table, 4, torch::kFloat32, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(4);
    for (size_t i = 0; i < fused->parameters().size(); ++i) {
      if (!Contains(fused->parameters()[i].name, ".bias")) continue;
      const torch::Tensor values = 0.1 * torch::randn(fused->parameters()[i].tensor.sizes());
      fused->parameters()[i].tensor.copy_(values);
      reference->parameters()[i].tensor.copy_(values);
    }
  }
  const torch::Tensor ids = torch::randint(0, 128, {2, 9}, torch::kInt64);
  const torch::Tensor labels = torch::randint(0, 128, {2, 9}, torch::kInt64);
  const torch::Tensor fused_loss = fused->LossSum(ids, labels, {});
  const torch::Tensor reference_loss = reference->LossSum(ids, labels, {});
  EXPECT_NEAR(fused_loss.item<double>(), reference_loss.item<double>(), 1e-5 * reference_loss.item<double>());
  fused_loss.backward();
  reference_loss.backward();
  for (size_t i = 0; i < fused->parameters().size(); ++i) {
    EXPECT_LT(testing::RelativeError(fused->parameters()[i].tensor.grad(), reference->parameters()[i].tensor.grad()),
              1e-4)
        << fused->parameters()[i].name;
  }
}

// --- Config parsing ---------------------------------------------------------------------------------

TEST(ConfigParsing, FamilyDefaults) {
  const auto qwen2 = ModelConfig::FromJson(testing::ReadConfig("qwen2"));
  EXPECT_TRUE(qwen2.attention_bias);
  EXPECT_FALSE(qwen2.attention_output_bias);
  EXPECT_EQ(qwen2.rope_theta, 1000000.0);
  const auto gemma = ModelConfig::FromJson(testing::ReadConfig("gemma"));
  EXPECT_TRUE(gemma.tie_word_embeddings);
  EXPECT_EQ(gemma.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(gemma.head_dim, 8);
  nlohmann::json no_head_dim = testing::ReadConfig("gemma");
  no_head_dim.erase("head_dim");
  no_head_dim.erase("tie_word_embeddings");
  no_head_dim.erase("hidden_activation");
  no_head_dim["hidden_act"] = "gelu";  // old Gemma configs; transformers still uses the tanh GELU
  const auto gemma_defaults = ModelConfig::FromJson(no_head_dim);
  EXPECT_EQ(gemma_defaults.head_dim, 256);
  EXPECT_TRUE(gemma_defaults.tie_word_embeddings);
  EXPECT_EQ(gemma_defaults.hidden_act, "gelu_pytorch_tanh");
  const auto llama = ModelConfig::FromJson(testing::ReadConfig("llama"));
  EXPECT_EQ(llama.rope_scaling.type, "llama3");
  EXPECT_EQ(llama.rope_scaling.factor, 8.0);
  EXPECT_EQ(llama.rope_scaling.original_max_position_embeddings, 8);
  EXPECT_EQ(llama.rope_theta, 500000.0);
  const auto phi3 = ModelConfig::FromJson(testing::ReadConfig("phi3"));
  EXPECT_EQ(phi3.head_dim, 8);
  EXPECT_EQ(phi3.partial_rotary_factor, 1.0);
  nlohmann::json mistral = testing::ReadConfig("mistral");
  EXPECT_EQ(ModelConfig::FromJson(mistral).sliding_window, (std::vector<int64_t>{0, 0}));
  mistral["sliding_window"] = 4;
  EXPECT_EQ(ModelConfig::FromJson(mistral).sliding_window, (std::vector<int64_t>{4, 4}));
}

TEST(ConfigParsing, TransformersFourStyleRope) {
  // 4.x: rope_theta at the top level and rope_scaling with "type" (older) or "rope_type".
  nlohmann::json v5 = testing::ReadConfig("llama");
  nlohmann::json v4 = v5;
  v4.erase("rope_parameters");
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = {{"rope_type", "llama3"},
                        {"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8}};
  const auto a = ModelConfig::FromJson(v5), b = ModelConfig::FromJson(v4);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_TRUE(torch::equal(RopeInverseFrequencies(a), RopeInverseFrequencies(b)));
  // ToJson keeps the 4.x layout for a 4.x config, and reads back the same.
  const nlohmann::json written = b.ToJson();
  EXPECT_TRUE(written.contains("rope_scaling"));
  EXPECT_FALSE(written.contains("rope_parameters"));
  EXPECT_TRUE(torch::equal(RopeInverseFrequencies(ModelConfig::FromJson(written)), RopeInverseFrequencies(a)));

  // Linear scaling divides every frequency by the factor; a null rope_scaling is the default rope.
  v4["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const auto linear = ModelConfig::FromJson(v4);
  v4["rope_scaling"] = nullptr;
  const auto plain = ModelConfig::FromJson(v4);
  EXPECT_EQ(plain.rope_scaling.type, "default");
  EXPECT_TRUE(torch::allclose(RopeInverseFrequencies(linear), RopeInverseFrequencies(plain) / 4.0, 0, 0));
}

TEST(ConfigParsing, Llama3FrequenciesFollowTheThreeBands) {
  // head_dim 8, theta 500000: inv_freq = theta^(-i/8), i = 0, 2, 4, 6. With original context 8,
  // low_freq_wavelen = 8 and high_freq_wavelen = 2: wavelengths 2*pi (~6.3, smoothed), then > 8 (divided).
  const auto config = ModelConfig::FromJson(testing::ReadConfig("llama"));
  nlohmann::json plain_json = testing::ReadConfig("llama");
  plain_json["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  const torch::Tensor plain = RopeInverseFrequencies(ModelConfig::FromJson(plain_json)).to(torch::kFloat64);
  const torch::Tensor scaled = RopeInverseFrequencies(config).to(torch::kFloat64);
  ASSERT_EQ(scaled.size(0), 4);
  const double f0 = plain[0].item<double>();
  const double smooth = (8.0 / (2 * M_PI / f0) - 1.0) / (4.0 - 1.0);
  EXPECT_NEAR(scaled[0].item<double>(), (1 - smooth) * f0 / 8 + smooth * f0, 1e-6 * f0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_NEAR(scaled[i].item<double>(), plain[i].item<double>() / 8, 1e-6 * plain[i].item<double>()) << i;
  }
}

}  // namespace
}  // namespace tigon::models
