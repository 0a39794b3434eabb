#include "server/validation.h"

#include "server/status_map.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

namespace tigon::server {
namespace {

const BatchLimits kLimits{/*vocab_size=*/256, /*max_position_embeddings=*/128, /*max_batch_tokens=*/1024};

v1::Batch MakeBatch(int64_t rows, int64_t seq_len) {
  v1::Batch batch;
  batch.set_batch(rows);
  batch.set_seq_len(seq_len);
  for (int64_t i = 0; i < rows * seq_len; ++i) batch.add_input_ids(static_cast<int32_t>(i % 256));
  return batch;
}

// Refused by the server with `code` and a message holding `fragment`, and by the engine's boundary check
// (what every Session call runs, tests/engine) with the same code and message: one batch contract.
void ExpectRefused(const v1::Batch& batch, grpc::StatusCode code, const std::string& fragment) {
  auto status = ValidateBatch(batch, kLimits);
  EXPECT_EQ(status.error_code(), code) << status.error_message();
  EXPECT_NE(status.error_message().find(fragment), std::string::npos)
      << "'" << status.error_message() << "' lacks '" << fragment << "'";
  const tigon::Status engine = tigon::CheckBatch(ToEngineBatch(batch), kLimits);
  EXPECT_EQ(ToGrpcCode(engine.code()), code) << engine.ToString();
  EXPECT_EQ(engine.message(), status.error_message());
}

TEST(ValidateBatch, AcceptsAWellFormedBatch) {
  v1::Batch batch = MakeBatch(2, 8);
  EXPECT_TRUE(ValidateBatch(batch, kLimits).ok());
  for (int i = 0; i < 16; ++i) batch.add_labels(i == 3 ? -100 : 255);
  for (int i = 0; i < 16; ++i) batch.add_loss_weights(i == 5 ? 0.0f : 0.5f);
  EXPECT_TRUE(ValidateBatch(batch, kLimits).ok());
}

TEST(ValidateBatch, ShapesMustMatch) {
  ExpectRefused(MakeBatch(0, 8), grpc::StatusCode::INVALID_ARGUMENT, "batch and seq_len must be positive");
  ExpectRefused(MakeBatch(2, -1), grpc::StatusCode::INVALID_ARGUMENT, "positive");
  v1::Batch batch = MakeBatch(2, 8);
  batch.add_input_ids(1);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "input_ids has 17 values");
  batch = MakeBatch(2, 8);
  batch.add_labels(1);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "labels has 1 values");
  batch = MakeBatch(2, 8);
  for (int i = 0; i < 15; ++i) batch.add_loss_weights(1.0f);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "loss_weights has 15 values");
}

TEST(ValidateBatch, TokenLimitIsResourceExhaustedAndOverflowSafe) {
  v1::Batch batch;
  batch.set_batch(33);
  batch.set_seq_len(32);  // 1056 > 1024
  ExpectRefused(batch, grpc::StatusCode::RESOURCE_EXHAUSTED, "--max-batch-tokens");
  batch.set_batch(int64_t{1} << 40);
  batch.set_seq_len(int64_t{1} << 40);  // the product overflows int64
  ExpectRefused(batch, grpc::StatusCode::RESOURCE_EXHAUSTED, "server limit");
}

TEST(ValidateBatch, SequenceLongerThanTheModelIsInvalid) {
  ExpectRefused(MakeBatch(1, 129), grpc::StatusCode::INVALID_ARGUMENT, "max_position_embeddings 128");
}

TEST(ValidateBatch, IdsAndLabelsOutsideTheVocabularyNameThePosition) {
  v1::Batch batch = MakeBatch(2, 8);
  batch.set_input_ids(13, 256);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "input_ids[1][5] = 256 is outside the vocabulary [0, 256)");
  batch.set_input_ids(13, -1);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "input_ids[1][5] = -1");
  batch = MakeBatch(2, 8);
  for (int i = 0; i < 16; ++i) batch.add_labels(i == 2 ? -99 : 1);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "labels[0][2] = -99");
}

TEST(ValidateBatch, WeightsMustBeFiniteAndNonNegative) {
  for (float bad : {-0.5f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    v1::Batch batch = MakeBatch(1, 4);
    for (int i = 0; i < 4; ++i) batch.add_loss_weights(i == 2 ? bad : 1.0f);
    ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "loss_weights[0][2]");
  }
}

TEST(ValidateBatch, ABatchWithoutTargetsIsInvalid) {
  ExpectRefused(MakeBatch(3, 1), grpc::StatusCode::INVALID_ARGUMENT, "seq_len must be at least 2");
  v1::Batch batch = MakeBatch(1, 4);
  for (int i = 0; i < 4; ++i) batch.add_labels(-100);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "every label is -100");
  batch = MakeBatch(1, 4);
  // Default labels: the last position is ignored, so its weight does not count.
  for (int i = 0; i < 4; ++i) batch.add_loss_weights(i == 3 ? 1.0f : 0.0f);
  ExpectRefused(batch, grpc::StatusCode::INVALID_ARGUMENT, "positive loss weight");
}

TEST(ToEngineBatch, CopiesEveryField) {
  v1::Batch batch = MakeBatch(2, 3);
  for (int i = 0; i < 6; ++i) batch.add_labels(i == 0 ? -100 : i);
  for (int i = 0; i < 6; ++i) batch.add_loss_weights(0.25f * i);
  tigon::Batch out = ToEngineBatch(batch);
  EXPECT_EQ(out.batch, 2);
  EXPECT_EQ(out.seq_len, 3);
  EXPECT_EQ(out.input_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(out.labels, (std::vector<int32_t>{-100, 1, 2, 3, 4, 5}));
  EXPECT_EQ(out.loss_weights, (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f}));
}

TEST(ToEngineBatch, CopiesTheObjective) {
  v1::Batch batch = MakeBatch(2, 2);
  batch.set_loss_fn("kto");
  batch.mutable_loss_config()->set_beta(0.25);
  batch.mutable_loss_config()->set_loss_type("ipo");
  for (int i = 0; i < 4; ++i) {
    batch.add_sampler_logprobs(-1.0f * i);
    batch.add_advantages(0.5f * i);
    batch.add_reference_logprobs(-2.0f * i);
  }
  batch.add_desirable(true);
  batch.add_desirable(false);
  const tigon::Batch out = ToEngineBatch(batch);
  EXPECT_EQ(out.loss_fn, "kto");
  EXPECT_EQ(out.loss_config.beta, 0.25);
  EXPECT_FALSE(out.loss_config.gamma.has_value()) << "unset settings stay unset (the objective's default)";
  EXPECT_EQ(out.loss_config.loss_type, "ipo");
  EXPECT_EQ(out.sampler_logprobs, (std::vector<float>{0, -1, -2, -3}));
  EXPECT_EQ(out.advantages, (std::vector<float>{0, 0.5f, 1, 1.5f}));
  EXPECT_EQ(out.reference_logprobs, (std::vector<float>{0, -2, -4, -6}));
  EXPECT_EQ(out.desirable, (std::vector<uint8_t>{1, 0}));
}

TEST(ValidateBatch, ObjectiveInputsFollowTheObjective) {
  v1::Batch ppo = MakeBatch(2, 4);
  ppo.set_loss_fn("ppo");
  ExpectRefused(ppo, grpc::StatusCode::INVALID_ARGUMENT, "ppo needs sampler_logprobs for every position");
  for (int i = 0; i < 8; ++i) ppo.add_sampler_logprobs(-1.0f);
  for (int i = 0; i < 7; ++i) ppo.add_advantages(1.0f);
  ExpectRefused(ppo, grpc::StatusCode::INVALID_ARGUMENT, "7 values");
  ppo.add_advantages(std::numeric_limits<float>::infinity());
  ExpectRefused(ppo, grpc::StatusCode::INVALID_ARGUMENT, "advantages[1][3] = inf is not finite");
  ppo.set_advantages(7, -2.0f);
  EXPECT_TRUE(ValidateBatch(ppo, kLimits).ok());
  ppo.mutable_loss_config()->set_clip_high_threshold(0.5);
  ExpectRefused(ppo, grpc::StatusCode::INVALID_ARGUMENT, "clip_high_threshold = 0.5 is invalid for ppo");
  ppo.mutable_loss_config()->clear_clip_high_threshold();
  ppo.mutable_loss_config()->set_beta(0.1);
  ExpectRefused(ppo, grpc::StatusCode::INVALID_ARGUMENT, "loss_config.beta is not a setting of ppo");

  v1::Batch simpo = MakeBatch(3, 4);
  simpo.set_loss_fn("simpo");
  ExpectRefused(simpo, grpc::StatusCode::INVALID_ARGUMENT, "odd number of rows (3)");
  v1::Batch dpo = MakeBatch(2, 4);
  dpo.set_loss_fn("dpo");
  for (int i = 0; i < 8; ++i) dpo.add_reference_logprobs(-1.0f);
  for (int i = 0; i < 8; ++i) dpo.add_labels(i < 4 ? -100 : 1);
  ExpectRefused(dpo, grpc::StatusCode::INVALID_ARGUMENT, "row 0 has none");
  dpo.set_labels(3, 7);
  EXPECT_TRUE(ValidateBatch(dpo, kLimits).ok());
  for (int i = 0; i < 8; ++i) dpo.add_loss_weights(1.0f);
  ExpectRefused(dpo, grpc::StatusCode::INVALID_ARGUMENT, "dpo takes no loss_weights");

  v1::Batch linear = MakeBatch(1, 4);
  for (int i = 0; i < 4; ++i) linear.add_loss_weights(-0.5f);
  ExpectRefused(linear, grpc::StatusCode::INVALID_ARGUMENT, "loss_weights[0][0] = -0.5 is not a finite value >= 0");
  linear.set_loss_fn("linear");
  EXPECT_TRUE(ValidateBatch(linear, kLimits).ok()) << "linear takes weights of any sign";
  linear.set_loss_fn("grpo");
  ExpectRefused(linear, grpc::StatusCode::INVALID_ARGUMENT, "loss_fn \"grpo\" is not one of cross_entropy, linear");
}

TEST(ValidateOptimizerSettings, RefusesOutOfRangeValues) {
  EXPECT_TRUE(ValidateOptimizerSettings(v1::OptimizerSettings()).ok());
  v1::OptimizerSettings s;
  s.set_lr(-1e-3);
  EXPECT_EQ(ValidateOptimizerSettings(s).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = {};
  s.set_beta1(1.0);
  EXPECT_NE(ValidateOptimizerSettings(s).error_message().find("beta1"), std::string::npos);
  s = {};
  s.set_beta2(std::nan(""));
  EXPECT_FALSE(ValidateOptimizerSettings(s).ok());
  s = {};
  s.set_eps(0.0);
  EXPECT_FALSE(ValidateOptimizerSettings(s).ok());
  s = {};
  s.set_weight_decay(-0.1);
  EXPECT_FALSE(ValidateOptimizerSettings(s).ok());
  s = {};
  s.set_max_grad_norm(std::numeric_limits<double>::infinity());
  EXPECT_FALSE(ValidateOptimizerSettings(s).ok());
  s = {};
  s.set_lr(0.0);
  s.set_max_grad_norm(0.0);
  EXPECT_TRUE(ValidateOptimizerSettings(s).ok());
  tigon::OptimizerOverrides o = ToEngineOverrides(s);
  EXPECT_EQ(o.lr, 0.0);
  EXPECT_EQ(o.max_grad_norm, 0.0);
  EXPECT_FALSE(o.beta1.has_value());
}

class ValidateCreateSessionTest : public testing::Test {
 protected:
  grpc::Status Validate(const v1::CreateSessionRequest& request, int devices = 0) {
    options_ = {};
    return ValidateCreateSession(request, {"llama", "gemma"}, devices, &options_);
  }
  v1::CreateSessionRequest Llama() {
    v1::CreateSessionRequest request;
    request.set_config_json(R"({"model_type": "llama", "vocab_size": 256})");
    return request;
  }
  tigon::SessionOptions options_;
};

TEST_F(ValidateCreateSessionTest, FillsTheEngineOptions) {
  v1::CreateSessionRequest request = Llama();
  request.set_precision("fp32");
  request.set_kernels("reference");
  (*request.mutable_kernel_overrides())["rms_norm"] = "fused";
  request.mutable_optimizer()->set_lr(0.01);
  request.set_seed(7);
  request.add_devices(1);
  ASSERT_TRUE(Validate(request, 2).ok());
  EXPECT_EQ(options_.config_json, request.config_json());
  EXPECT_EQ(options_.precision, "fp32");
  EXPECT_EQ(options_.kernels, "reference");
  EXPECT_EQ(options_.kernel_overrides.at("rms_norm"), "fused");
  EXPECT_DOUBLE_EQ(options_.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(options_.optimizer.beta2, tigon::OptimizerSettings().beta2);
  EXPECT_EQ(options_.seed, 7u);
  EXPECT_EQ(options_.devices, std::vector<int>{1});
}

TEST_F(ValidateCreateSessionTest, EmptyFieldsTakeTheDocumentedDefaults) {
  ASSERT_TRUE(Validate(Llama()).ok());
  EXPECT_EQ(options_.precision, "bf16");
  EXPECT_EQ(options_.kernels, "fused");
  EXPECT_TRUE(options_.devices.empty());
}

TEST_F(ValidateCreateSessionTest, BadModelsAreRefused) {
  v1::CreateSessionRequest request;
  EXPECT_EQ(Validate(request).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  request.set_config_json("{not json");
  EXPECT_NE(Validate(request).error_message().find("config_json is not valid JSON"), std::string::npos);
  request.set_config_json("[1, 2]");
  EXPECT_NE(Validate(request).error_message().find("not a JSON object"), std::string::npos);
  request.set_config_json(R"({"vocab_size": 3})");
  EXPECT_NE(Validate(request).error_message().find("model_type"), std::string::npos);
  request.set_config_json(R"({"model_type": "gpt2"})");
  auto status = Validate(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("supported: llama, gemma"), std::string::npos) << status.error_message();
  // model_path: the folder ModelRoots::Resolve found, with its config.json (nothing of it echoed).
  request.set_model_path("llama");
  EXPECT_EQ(Validate(request).error_code(), grpc::StatusCode::FAILED_PRECONDITION) << "not resolved";
  ModelFolder folder{"/models/llama", R"({"model_type": "SECRET-1"})"};
  status = ValidateCreateSession(request, {"llama", "gemma"}, 0, &options_, 0, &folder);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message().find("SECRET"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("supported: llama, gemma"), std::string::npos) << status.error_message();
  folder.config_json = "{not json";
  EXPECT_EQ(ValidateCreateSession(request, {"llama"}, 0, &options_, 0, &folder).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  folder.config_json = R"({"model_type": "llama"})";
  EXPECT_TRUE(ValidateCreateSession(request, {"llama"}, 0, &options_, 0, &folder).ok());
  EXPECT_EQ(options_.model_path, "/models/llama");
}

TEST_F(ValidateCreateSessionTest, BadSettingsAreRefused) {
  auto request = Llama();
  request.set_precision("fp8");
  EXPECT_NE(Validate(request).error_message().find("precision"), std::string::npos);
  request = Llama();
  request.set_kernels("fast");
  EXPECT_FALSE(Validate(request).ok());
  request = Llama();
  (*request.mutable_kernel_overrides())["rope"] = "maybe";
  EXPECT_NE(Validate(request).error_message().find("kernel_overrides[\"rope\"]"), std::string::npos);
  request = Llama();
  request.mutable_optimizer()->set_eps(-1);
  EXPECT_FALSE(Validate(request).ok());
  request = Llama();
  request.add_devices(0);
  EXPECT_NE(Validate(request, 0).error_message().find("no CUDA devices"), std::string::npos);
  request.add_devices(0);
  EXPECT_NE(Validate(request, 2).error_message().find("listed twice"), std::string::npos);
  request = Llama();
  request.add_devices(2);
  EXPECT_NE(Validate(request, 2).error_message().find("0..1"), std::string::npos);
}


TEST_F(ValidateCreateSessionTest, MaxParametersGoesToTheEngineWhichCountsTheModel) {
  // The server does not count parameters (that needs each family's rules); the engine does, before it
  // allocates (tests/engine/test_memory_estimate.cpp, tests/integration/test_security.py).
  v1::CreateSessionRequest request = Llama();
  ASSERT_TRUE(ValidateCreateSession(request, {"llama"}, 0, &options_, 5'000'000).ok());
  EXPECT_EQ(options_.max_parameters, 5'000'000);
  ASSERT_TRUE(ValidateCreateSession(request, {"llama"}, 0, &options_, 0).ok());
  EXPECT_EQ(options_.max_parameters, 0) << "0: no limit";
}

TEST_F(ValidateCreateSessionTest, DeeplyNestedConfigJsonIsRefusedWithoutRecursion) {
  // 100,000 levels crashed the server (a recursive copy of the parsed value overflowed the stack).
  v1::CreateSessionRequest request;
  request.set_config_json(R"({"model_type": "llama", "x": )" + std::string(100000, '[') + std::string(100000, ']') +
                          "}");
  const grpc::Status status = ValidateCreateSession(request, {"llama"}, 0, &options_);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("deeper than 64"), std::string::npos) << status.error_message();
  // 64 levels are accepted (what the engine then makes of the field is its business).
  request.set_config_json(R"({"model_type": "llama", "x": )" + std::string(63, '[') + std::string(63, ']') + "}");
  EXPECT_TRUE(ValidateCreateSession(request, {"llama"}, 0, &options_).ok());
}

}  // namespace
}  // namespace tigon::server
