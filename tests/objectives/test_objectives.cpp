// The objectives (engine.h's kObjectiveNames) against float64 references written here in the TRL and
// Tinker forms, differentiated by autograd: the loss, the per-token coefficients dL/dlp, the figures, and
// the model's parameter gradients through the fused and the reference LM head.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>

#include "engine/contract/objective_settings.h"
#include "models/model.h"
#include "objectives/objectives.h"

namespace tigon::engine {
namespace {

using torch::Tensor;
namespace F = torch::nn::functional;

const auto kDouble = torch::TensorOptions().dtype(torch::kFloat64);

// A batch of [rows, seq_len] with random inputs of every kind; each row's first `prompt` labels ignored.
struct Case {
  BatchTensors batch;
  Tensor logprobs;  // [B, T] fp32, 0 where ignored
};

Case RandomCase(int64_t rows, int64_t seq_len, int64_t prompt, uint64_t seed, bool weights, int64_t vocab = 50) {
  torch::manual_seed(seed);
  Case c;
  Tensor labels = torch::randint(0, vocab, {rows, seq_len}, torch::kLong);
  labels.narrow(1, 0, prompt).fill_(kIgnoreIndex);
  labels.index_put_({torch::rand({rows, seq_len}) < 0.15}, kIgnoreIndex);
  labels.select(1, seq_len - 1).fill_(3);  // every row keeps a target token
  c.batch.labels = labels;
  c.batch.input_ids = torch::randint(0, vocab, {rows, seq_len}, torch::kLong);
  const Tensor valid = labels.ne(kIgnoreIndex);
  c.logprobs = (-3 * torch::rand({rows, seq_len}) - 0.01).masked_fill(valid.logical_not(), 0);
  if (weights) c.batch.weights = torch::rand({rows, seq_len});
  c.batch.sampler_logprobs = c.logprobs + 0.4 * torch::randn({rows, seq_len});  // ratios well past the clips
  c.batch.advantages = torch::randn({rows, seq_len});
  c.batch.reference_logprobs = c.logprobs + 0.3 * torch::randn({rows, seq_len});
  c.batch.desirable = torch::rand({rows}) < 0.5;
  c.batch.desirable[0] = true;
  c.batch.desirable[1] = false;
  return c;
}

objectives::Settings Settings(const std::string& loss_fn, LossConfig config = {}) {
  objectives::Settings settings;
  const Status status = objectives::Resolve(loss_fn, config, &settings);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return settings;
}

// The reference: loss_sum as a function of lp [B, T] float64 (requires grad), written the way TRL and
// Tinker write each loss, and the count it is a mean over.
struct Reference {
  Tensor loss_sum;
  int64_t count;
};

Tensor Rows(const Tensor& t, int64_t first) {
  return t.index_select(0, torch::arange(first, t.size(0), 2, torch::kLong).to(t.device()));
}

Reference ReferenceLoss(const objectives::Settings& s, const Tensor& lp, const BatchTensors& b) {
  using objectives::Kind;
  const Tensor valid = b.labels.ne(kIgnoreIndex).to(torch::kFloat64);
  const Tensor w = b.weights.defined() ? b.weights.to(torch::kFloat64) : torch::ones_like(valid);
  const auto tokens = static_cast<int64_t>(valid.sum().item<double>());
  const Tensor sampler = b.sampler_logprobs.to(torch::kFloat64), adv = b.advantages.to(torch::kFloat64);
  const Tensor ratio = torch::exp(lp - sampler);
  switch (s.kind) {
    case Kind::kCrossEntropy:
      return {-(w * lp * valid).sum(), tokens};
    case Kind::kLinear:
      return {-(w * lp * valid).sum(), 1};
    case Kind::kImportanceSampling:
      return {-(w * ratio * adv * valid).sum(), tokens};
    case Kind::kPpo: {
      const Tensor objective =
          torch::min(ratio * adv, torch::clamp(ratio, s.clip_low_threshold, s.clip_high_threshold) * adv);
      return {-(w * objective * valid).sum(), tokens};
    }
    case Kind::kCispo: {
      const Tensor clipped = torch::clamp(ratio, s.clip_low_threshold, s.clip_high_threshold).detach();
      return {-(w * clipped * lp * adv * valid).sum(), tokens};
    }
    default:
      break;
  }
  const Tensor logps = (lp * valid).sum(-1);
  const Tensor lengths = valid.sum(-1);
  const Tensor ref_logps = (b.reference_logprobs.to(torch::kFloat64) * valid).sum(-1);
  const Tensor pc = Rows(logps, 0), pr = Rows(logps, 1), rc = Rows(ref_logps, 0), rr = Rows(ref_logps, 1);
  const Tensor ac = pc / Rows(lengths, 0), ar = pr / Rows(lengths, 1);
  const int64_t pairs = lp.size(0) / 2;
  const double beta = s.beta, eps = s.label_smoothing;
  auto sigmoid_loss = [&](const Tensor& logits) {
    return -F::logsigmoid(beta * logits) * (1 - eps) - F::logsigmoid(-beta * logits) * eps;
  };
  // The chosen rows' cross-entropy, a mean over their tokens.
  auto chosen_nll = [&] { return -(Rows(lp * valid, 0)).sum() / Rows(valid, 0).sum(); };
  switch (s.kind) {
    case Kind::kDpo: {
      if (s.loss_type == "ipo") {
        const Tensor logits = (ac - rc / Rows(lengths, 0)) - (ar - rr / Rows(lengths, 1));
        return {(logits - 1 / (2 * beta)).pow(2).sum(), pairs};
      }
      const Tensor logits = (pc - rc) - (pr - rr);
      if (s.loss_type == "hinge") return {torch::relu(1 - beta * logits).sum(), pairs};
      return {sigmoid_loss(logits).sum(), pairs};
    }
    case Kind::kSimpo:
      return {sigmoid_loss(ac - ar - s.gamma / beta).sum(), pairs};
    case Kind::kCpo:
      return {sigmoid_loss(pc - pr).sum() + s.cpo_alpha * pairs * chosen_nll(), pairs};
    case Kind::kOrpo: {
      const Tensor log_odds = (ac - ar) - (torch::log1p(-torch::exp(ac)) - torch::log1p(-torch::exp(ar)));
      return {pairs * chosen_nll() - (beta * F::logsigmoid(log_odds)).sum(), pairs};
    }
    case Kind::kKto: {
      const Tensor d = logps - ref_logps;
      const Tensor z = torch::clamp(d.mean(), 0).detach();
      const Tensor desirable = b.desirable;
      const Tensor loss = torch::where(desirable, s.desirable_weight * (1 - torch::sigmoid(beta * (d - z))),
                                       s.undesirable_weight * (1 - torch::sigmoid(beta * (z - d))));
      return {loss.sum(), lp.size(0)};
    }
    default:
      ADD_FAILURE() << "no reference";
      return {};
  }
}

// What the engine computes for `c` equals the reference's loss and autograd gradient.
void ExpectMatchesReference(const objectives::Settings& s, const Case& c, const std::string& what) {
  SCOPED_TRACE(what);
  const ObjectiveValue value = EvaluateObjective(s, c.logprobs, c.batch);
  Tensor lp = c.logprobs.to(torch::kFloat64).detach().requires_grad_(true);
  const Reference ref = ReferenceLoss(s, lp, c.batch);
  ref.loss_sum.backward();
  EXPECT_EQ(value.count, ref.count);
  EXPECT_NEAR(value.loss_sum, ref.loss_sum.item<double>(), 1e-9 * (1 + std::abs(ref.loss_sum.item<double>())));
  const Tensor expected = lp.grad().masked_fill(c.batch.labels.eq(kIgnoreIndex), 0);
  EXPECT_TRUE(torch::allclose(value.coefficients.to(torch::kFloat64), expected, 1e-5, 1e-7))
      << "max difference " << (value.coefficients.to(torch::kFloat64) - expected).abs().max().item<double>();
  // Not all zero: the check has something to compare.
  EXPECT_GT(expected.abs().sum().item<double>(), 0);
}

TEST(Objectives, TokenObjectivesMatchTheirFormulas) {
  for (bool weights : {false, true}) {
    const Case c = RandomCase(3, 11, 2, weights ? 1 : 2, weights);
    for (const char* name : {"cross_entropy", "linear", "importance_sampling", "ppo", "cispo"}) {
      ExpectMatchesReference(Settings(name), c, std::string(name) + (weights ? " weighted" : ""));
    }
    LossConfig tight;
    tight.clip_low_threshold = 0.9;
    tight.clip_high_threshold = 1.05;
    ExpectMatchesReference(Settings("ppo", tight), c, "ppo tight");
    ExpectMatchesReference(Settings("cispo", tight), c, "cispo tight");
  }
}

TEST(Objectives, PairAndKtoObjectivesMatchTheirFormulas) {
  const Case c = RandomCase(6, 9, 3, 3, false);
  for (const char* name : {"dpo", "simpo", "cpo", "orpo", "kto"}) ExpectMatchesReference(Settings(name), c, name);
  for (const char* type : {"ipo", "hinge"}) {
    LossConfig config;
    config.loss_type = type;
    config.beta = 0.5;
    ExpectMatchesReference(Settings("dpo", config), c, std::string("dpo ") + type);
  }
  LossConfig smooth;
  smooth.label_smoothing = 0.2;
  smooth.beta = 0.3;
  for (const char* name : {"dpo", "simpo", "cpo"}) ExpectMatchesReference(Settings(name, smooth), c, std::string(name) + " smoothed");
  LossConfig kto;
  kto.desirable_weight = 1.5;
  kto.undesirable_weight = 0.5;
  kto.beta = 0.7;
  ExpectMatchesReference(Settings("kto", kto), c, "kto weighted");
}

TEST(Objectives, FiguresFollowTheirDefinitions) {
  const Case c = RandomCase(4, 13, 1, 4, false);
  const Tensor valid = c.batch.labels.ne(kIgnoreIndex);
  const Tensor lp = c.logprobs.to(torch::kFloat64), sampler = c.batch.sampler_logprobs.to(torch::kFloat64);
  const Tensor ratio = torch::exp(lp - sampler).masked_select(valid);
  const Tensor adv = c.batch.advantages.to(torch::kFloat64).masked_select(valid);
  const auto ppo = EvaluateObjective(Settings("ppo"), c.logprobs, c.batch);
  const Tensor clipped = torch::clamp(ratio, 0.8, 1.2) * adv < ratio * adv;
  EXPECT_NEAR(ppo.metrics.at("clip_fraction"), clipped.to(torch::kFloat64).mean().item<double>(), 1e-12);
  EXPECT_GT(ppo.metrics.at("clip_fraction"), 0.05);
  EXPECT_NEAR(ppo.metrics.at("ratio_mean"), ratio.mean().item<double>(), 1e-12);
  EXPECT_NEAR(ppo.metrics.at("sampler_kl"), (sampler - lp).masked_select(valid).mean().item<double>(), 1e-12);

  const auto dpo = EvaluateObjective(Settings("dpo"), c.logprobs, c.batch);
  const Tensor vd = valid.to(torch::kFloat64);
  const Tensor d = 0.1 * ((lp - c.batch.reference_logprobs.to(torch::kFloat64)) * vd).sum(1);
  const Tensor chosen = Rows(d, 0), rejected = Rows(d, 1);
  EXPECT_NEAR(dpo.metrics.at("rewards_chosen"), chosen.mean().item<double>(), 1e-12);
  EXPECT_NEAR(dpo.metrics.at("rewards_rejected"), rejected.mean().item<double>(), 1e-12);
  EXPECT_NEAR(dpo.metrics.at("reward_margin"), (chosen - rejected).mean().item<double>(), 1e-12);
  EXPECT_NEAR(dpo.metrics.at("reward_accuracy"), (chosen > rejected).to(torch::kFloat64).mean().item<double>(), 1e-12);
}

// The model's parameter gradients under each objective: fused head (and reference head) against autograd
// through full logits and the reference formula.
void ExpectModelGradients(const std::string& loss_fn, bool fused, const torch::Device& device) {
  SCOPED_TRACE(loss_fn + (fused ? " fused" : " reference") + " on " + device.str());
  const nlohmann::json config = {{"model_type", "llama"},   {"vocab_size", 61},        {"hidden_size", 24},
                                 {"intermediate_size", 40}, {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"head_dim", 6},           {"max_position_embeddings", 64},
                                 {"rms_norm_eps", 1e-5},    {"initializer_range", 0.2}, {"tie_word_embeddings", false}};
  const auto parsed = models::ModelConfig::FromJson(config);
  const models::OpTable ops = fused ? models::OpTable::AllFused(parsed) : models::OpTable::AllReference(parsed);
  auto model = models::CreateRandom(config, &ops, 11, torch::kFloat32, device);
  Case c = RandomCase(4, 7, 2, 5, loss_fn == "ppo", 61);
  for (Tensor* t : {&c.batch.input_ids, &c.batch.labels, &c.batch.weights, &c.batch.advantages, &c.batch.desirable}) {
    if (t->defined()) *t = t->to(device);
  }
  const objectives::Settings settings = Settings(loss_fn);
  // The sampler and reference near the model's own log-probabilities, so that clipping is exercised.
  const Tensor own = model->TokenLogProbs(c.batch.input_ids, c.batch.labels);
  c.batch.sampler_logprobs = own + 0.2 * torch::randn(own.sizes()).to(device);
  c.batch.reference_logprobs = own + 0.2 * torch::randn(own.sizes()).to(device);

  const ObjectivePass pass = ForwardObjective(*model, settings, c.batch);
  pass.loss_sum.backward();
  std::vector<Tensor> grads;
  for (auto& p : model->parameters()) {
    grads.push_back(p.tensor.grad().clone().cpu());
    p.tensor.mutable_grad().zero_();
  }
  const Tensor logits = model->Logits(c.batch.input_ids).to(torch::kFloat64);
  const Tensor safe = c.batch.labels.clamp_min(0).unsqueeze(-1);
  const Tensor lp = (torch::log_softmax(logits, -1).gather(-1, safe).squeeze(-1))
                        .masked_fill(c.batch.labels.eq(kIgnoreIndex), 0);
  const Reference ref = ReferenceLoss(settings, lp, c.batch);
  ref.loss_sum.backward();
  EXPECT_NEAR(pass.loss_sum_value, ref.loss_sum.item<double>(), 1e-4 * (1 + std::abs(ref.loss_sum.item<double>())));
  EXPECT_EQ(pass.count, ref.count);
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor expected = model->parameters()[i].tensor.grad().cpu();
    const double scale = expected.abs().max().item<double>();
    EXPECT_GT(scale, 0) << model->parameters()[i].name;
    EXPECT_LT((grads[i] - expected).abs().max().item<double>(), 2e-4 * scale + 1e-7) << model->parameters()[i].name;
  }
}

// The CPU, and the CUDA kernels too where there is a GPU (the device machine runs this suite as well).
std::vector<torch::Device> Devices() {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA, 0);
  return devices;
}

TEST(Objectives, ModelGradientsThroughTheFusedHead) {
  for (const auto& device : Devices()) {
    for (const char* name : {"cross_entropy", "importance_sampling", "ppo", "cispo", "dpo", "simpo", "cpo", "orpo", "kto"}) {
      ExpectModelGradients(name, true, device);
    }
  }
}

TEST(Objectives, ModelGradientsThroughTheReferenceHead) {
  for (const auto& device : Devices()) {
    for (const char* name : {"ppo", "dpo", "kto"}) ExpectModelGradients(name, false, device);
  }
}

}  // namespace
}  // namespace tigon::engine
