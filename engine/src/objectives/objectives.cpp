// The objectives as functions of per-token log-probabilities (objectives.h; the formulas are engine.h's).
#include "objectives/objectives.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace tigon::engine {
namespace {

using objectives::Kind;
using torch::Tensor;

Tensor Double(const Tensor& t) { return t.to(torch::kFloat64); }

double Value(const Tensor& t) { return t.item<double>(); }

Tensor LogSigmoid(const Tensor& x) { return torch::nn::functional::logsigmoid(x); }

// Token objectives: every target token on its own; count = target tokens.
void TokenObjective(const objectives::Settings& s, const Tensor& lp, const Tensor& valid, const BatchTensors& b,
                    ObjectiveValue* out) {
  Tensor w = b.weights.defined() ? Double(b.weights) * valid : valid.clone();
  if (s.kind == Kind::kCrossEntropy || s.kind == Kind::kLinear) {
    out->loss_sum = Value(-(w * lp).sum());
    out->coefficients = -w;
    return;
  }
  const Tensor advantages = Double(b.advantages) * valid;
  // Ignored positions get log-ratio 0, so that a sampler value there cannot overflow exp.
  const Tensor log_ratio = (lp - Double(b.sampler_logprobs)) * valid;
  const Tensor ratio = log_ratio.exp();
  const double tokens = std::max(1.0, Value(valid.sum()));  // a chunk of the fused head may hold none
  Tensor loss, clipped_tokens;
  switch (s.kind) {
    case Kind::kImportanceSampling:
      loss = -w * ratio * advantages;
      out->coefficients = -w * ratio * advantages;
      break;
    case Kind::kPpo: {
      const Tensor unclipped = ratio * advantages;
      const Tensor clipped = ratio.clamp(s.clip_low_threshold, s.clip_high_threshold) * advantages;
      loss = -w * torch::minimum(unclipped, clipped);
      // Where the clipped term is the smaller, the loss is constant in lp.
      out->coefficients = torch::where(unclipped <= clipped, -w * ratio * advantages, torch::zeros_like(lp));
      clipped_tokens = (clipped < unclipped).logical_and(valid.to(torch::kBool));
      break;
    }
    case Kind::kCispo: {
      const Tensor clipped_ratio = ratio.clamp(s.clip_low_threshold, s.clip_high_threshold);
      loss = -w * clipped_ratio * advantages * lp;
      out->coefficients = -w * clipped_ratio * advantages;
      clipped_tokens = (clipped_ratio != ratio).logical_and(valid.to(torch::kBool));
      break;
    }
    default:
      throw std::logic_error("not a token objective");
  }
  out->loss_sum = Value(loss.sum());
  out->metrics["ratio_mean"] = Value((ratio * valid).sum()) / tokens;
  // k1 estimate of KL(sampler || policy) over the target tokens.
  out->metrics["sampler_kl"] = Value((-log_ratio).sum()) / tokens;
  if (clipped_tokens.defined()) out->metrics["clip_fraction"] = Value(clipped_tokens.sum().to(torch::kFloat64)) / tokens;
}

// Adds each row's gradient with respect to its log-probability sum (or mean) to its target tokens.
Tensor RowCoefficients(const Tensor& grad_of_sum, const Tensor& valid) { return grad_of_sum.unsqueeze(1) * valid; }

void RewardMetrics(const Tensor& chosen, const Tensor& rejected, ObjectiveValue* out) {
  out->metrics["rewards_chosen"] = Value(chosen.mean());
  out->metrics["rewards_rejected"] = Value(rejected.mean());
  out->metrics["reward_margin"] = Value((chosen - rejected).mean());
  out->metrics["reward_accuracy"] = Value((chosen > rejected).to(torch::kFloat64).mean());
}

// -(1 - e) logsig(x) - e logsig(-x) and its derivative in x.
std::pair<Tensor, Tensor> SmoothedSigmoidLoss(const Tensor& x, double e) {
  const Tensor loss = -(1 - e) * LogSigmoid(x) - e * LogSigmoid(-x);
  const Tensor grad = -(1 - e) * torch::sigmoid(-x) + e * torch::sigmoid(x);
  return {loss, grad};
}

// Pair objectives: rows (2i, 2i + 1) = (chosen, rejected); count = pairs.
void PairObjective(const objectives::Settings& s, const Tensor& lp, const Tensor& valid, const BatchTensors& b,
                   ObjectiveValue* out) {
  const int64_t rows = lp.size(0), pairs = rows / 2;
  const Tensor sums = (lp * valid).sum(1);  // [B]
  const Tensor lengths = valid.sum(1);
  const Tensor means = sums / lengths;
  const Tensor ref_sums = b.reference_logprobs.defined() ? (Double(b.reference_logprobs) * valid).sum(1)
                                                         : torch::zeros_like(sums);
  auto chosen = [&](const Tensor& t) { return t.view({pairs, 2}).select(1, 0); };
  auto rejected = [&](const Tensor& t) { return t.view({pairs, 2}).select(1, 1); };
  // Per row: d loss_sum / d (row's sum of lp), filled by each objective (the means' gradient is / length).
  Tensor grad_sum = torch::zeros_like(sums);
  auto set_pair_grad = [&](const Tensor& g_chosen, const Tensor& g_rejected) {
    grad_sum.view({pairs, 2}).select(1, 0).copy_(g_chosen);
    grad_sum.view({pairs, 2}).select(1, 1).copy_(g_rejected);
  };
  Tensor pair_loss;
  const double beta = s.beta;
  switch (s.kind) {
    case Kind::kDpo: {
      if (s.loss_type == "ipo") {
        // Per-token means (the IPO paper's length normalisation).
        const Tensor ref_means = ref_sums / lengths;
        const Tensor hc = chosen(means) - chosen(ref_means), hr = rejected(means) - rejected(ref_means);
        const Tensor h = hc - hr;
        pair_loss = (h - 1 / (2 * beta)).pow(2);
        const Tensor g = 2 * (h - 1 / (2 * beta));
        set_pair_grad(g / chosen(lengths), -g / rejected(lengths));
        RewardMetrics(beta * hc, beta * hr, out);
        break;
      }
      const Tensor hc = chosen(sums) - chosen(ref_sums), hr = rejected(sums) - rejected(ref_sums);
      const Tensor h = hc - hr;
      Tensor g;
      if (s.loss_type == "hinge") {
        pair_loss = torch::relu(1 - beta * h);
        g = torch::where(1 - beta * h > 0, torch::full_like(h, -beta), torch::zeros_like(h));
      } else {
        auto [loss, grad_x] = SmoothedSigmoidLoss(beta * h, s.label_smoothing);
        pair_loss = loss;
        g = beta * grad_x;
      }
      set_pair_grad(g, -g);
      RewardMetrics(beta * hc, beta * hr, out);
      break;
    }
    case Kind::kSimpo: {
      const Tensor h = chosen(means) - rejected(means);
      auto [loss, grad_x] = SmoothedSigmoidLoss(beta * h - s.gamma, s.label_smoothing);
      pair_loss = loss;
      set_pair_grad(beta * grad_x / chosen(lengths), -beta * grad_x / rejected(lengths));
      RewardMetrics(beta * chosen(means), beta * rejected(means), out);
      break;
    }
    case Kind::kCpo: {
      const Tensor h = chosen(sums) - rejected(sums);
      auto [loss, grad_x] = SmoothedSigmoidLoss(beta * h, s.label_smoothing);
      pair_loss = loss;
      set_pair_grad(beta * grad_x, -beta * grad_x);
      RewardMetrics(beta * chosen(sums), beta * rejected(sums), out);
      break;
    }
    case Kind::kOrpo: {
      // log odds(x) = x - log(1 - exp(x)) of the mean log-probability; x kept below 0 so that it stays finite.
      const Tensor xc = chosen(means).clamp_max(-1e-9), xr = rejected(means).clamp_max(-1e-9);
      const Tensor log_odds = (xc - torch::log(-torch::expm1(xc))) - (xr - torch::log(-torch::expm1(xr)));
      pair_loss = -beta * LogSigmoid(log_odds);
      const Tensor g = -beta * torch::sigmoid(-log_odds);  // d pair_loss / d log_odds
      set_pair_grad(g * (-1 / torch::expm1(xc)) / chosen(lengths), g * (1 / torch::expm1(xr)) / rejected(lengths));
      RewardMetrics(beta * chosen(means), beta * rejected(means), out);
      out->metrics["log_odds_ratio"] = Value(log_odds.mean());
      break;
    }
    default:
      throw std::logic_error("not a pair objective");
  }
  out->loss_sum = Value(pair_loss.sum());
  out->coefficients = RowCoefficients(grad_sum, valid);
  // cpo and orpo add the chosen rows' cross-entropy, a mean over their tokens (times the pairs, as the
  // loss is a mean over pairs).
  const double nll_weight = s.kind == Kind::kCpo ? s.cpo_alpha : s.kind == Kind::kOrpo ? 1.0 : 0.0;
  if (nll_weight > 0) {
    const Tensor chosen_rows = (torch::arange(rows, lp.options().dtype(torch::kLong)) % 2 == 0).to(torch::kFloat64);
    const Tensor chosen_valid = valid * chosen_rows.unsqueeze(1);
    const double chosen_tokens = Value(chosen_valid.sum());
    const double nll = -Value((lp * chosen_valid).sum()) / chosen_tokens;
    out->loss_sum += nll_weight * static_cast<double>(pairs) * nll;
    out->coefficients = out->coefficients - (nll_weight * static_cast<double>(pairs) / chosen_tokens) * chosen_valid;
    out->metrics["nll"] = nll;
  }
  out->count = pairs;
}

// kto: each row desirable or not against the batch's KL estimate z; count = rows.
void KtoObjective(const objectives::Settings& s, const Tensor& lp, const Tensor& valid, const BatchTensors& b,
                  ObjectiveValue* out) {
  const Tensor d = (lp * valid).sum(1) - (Double(b.reference_logprobs) * valid).sum(1);
  const double z = std::max(0.0, Value(d.mean()));
  const Tensor desirable = b.desirable.to(lp.device()).to(torch::kBool);
  const double beta = s.beta;
  const Tensor x = beta * (d - z), y = beta * (z - d);
  const Tensor loss = torch::where(desirable, s.desirable_weight * (1 - torch::sigmoid(x)),
                                   s.undesirable_weight * (1 - torch::sigmoid(y)));
  const Tensor grad = torch::where(desirable, -s.desirable_weight * beta * torch::sigmoid(x) * torch::sigmoid(-x),
                                   s.undesirable_weight * beta * torch::sigmoid(y) * torch::sigmoid(-y));
  out->loss_sum = Value(loss.sum());
  out->coefficients = RowCoefficients(grad, valid);
  out->count = lp.size(0);
  out->metrics["kl"] = z;
  const Tensor rewards = beta * d;
  const double n_desirable = Value(desirable.sum().to(torch::kFloat64));
  const double n_undesirable = static_cast<double>(lp.size(0)) - n_desirable;
  if (n_desirable > 0) out->metrics["rewards_desirable"] = Value(rewards.masked_select(desirable).sum()) / n_desirable;
  if (n_undesirable > 0)
    out->metrics["rewards_undesirable"] = Value(rewards.masked_select(desirable.logical_not()).sum()) / n_undesirable;
}

Tensor FromBlob(const std::vector<float>& values, const std::vector<int64_t>& shape, const torch::Device& device) {
  if (values.empty()) return Tensor();
  return torch::from_blob(const_cast<float*>(values.data()), shape, torch::kFloat).clone().to(device);
}

}  // namespace

BatchTensors ToBatchTensors(const Batch& batch, const torch::Device& device) {
  const std::vector<int64_t> shape{batch.batch, batch.seq_len};
  BatchTensors out;
  Tensor ids = torch::from_blob(const_cast<int32_t*>(batch.input_ids.data()), shape, torch::kInt32).to(torch::kLong);
  Tensor labels;
  if (batch.labels.empty()) {
    labels = torch::full(shape, kIgnoreIndex, torch::kLong);
    labels.narrow(1, 0, batch.seq_len - 1).copy_(ids.narrow(1, 1, batch.seq_len - 1));
  } else {
    labels = torch::from_blob(const_cast<int32_t*>(batch.labels.data()), shape, torch::kInt32).to(torch::kLong);
  }
  out.input_ids = ids.to(device);
  out.labels = labels.to(device);
  out.weights = FromBlob(batch.loss_weights, shape, device);
  out.sampler_logprobs = FromBlob(batch.sampler_logprobs, shape, device);
  out.advantages = FromBlob(batch.advantages, shape, device);
  out.reference_logprobs = FromBlob(batch.reference_logprobs, shape, device);
  if (!batch.desirable.empty()) {
    out.desirable = torch::from_blob(const_cast<uint8_t*>(batch.desirable.data()), {batch.batch}, torch::kUInt8)
                        .to(torch::kBool)
                        .to(device);
  }
  return out;
}

ObjectiveValue EvaluateObjective(const objectives::Settings& settings, const Tensor& logprobs,
                                 const BatchTensors& batch) {
  torch::NoGradGuard no_grad;
  const Tensor valid = batch.labels.ne(kIgnoreIndex).to(torch::kFloat64);
  const Tensor lp = Double(logprobs) * valid;
  ObjectiveValue out;
  const int64_t tokens = static_cast<int64_t>(Value(valid.sum()));
  if (objectives::PairsRows(settings.kind)) {
    PairObjective(settings, lp, valid, batch, &out);
  } else if (settings.kind == Kind::kKto) {
    KtoObjective(settings, lp, valid, batch, &out);
  } else {
    TokenObjective(settings, lp, valid, batch, &out);
    out.count = settings.kind == Kind::kLinear ? 1 : tokens;
  }
  out.coefficients = out.coefficients.to(torch::kFloat32);
  return out;
}

ObjectivePass ForwardObjective(const models::DecoderModel& model, const objectives::Settings& settings,
                               const BatchTensors& batch) {
  ObjectivePass pass;
  pass.tokens = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  if (settings.kind == Kind::kCrossEntropy || settings.kind == Kind::kLinear) {
    CrossEntropyOptions options;
    options.label_smoothing = settings.label_smoothing;
    options.z_loss_scale = settings.z_loss;
    pass.loss_sum = model.LossSum(batch.input_ids, batch.labels, batch.weights, options);
    pass.loss_sum_value = pass.loss_sum.item<double>();
    pass.count = settings.kind == Kind::kLinear ? 1 : pass.tokens;
    return pass;
  }
  return HeadObjective(model, settings, model.HiddenStates(batch.input_ids), batch);
}

namespace {

// The batch's rows [first, first + count), or (rows = false) its tokens [first, first + count) in
// row-major order as one row: what a chunk of the fused head covers.
BatchTensors Slice(const BatchTensors& b, int64_t first, int64_t count, bool rows) {
  auto cut = [&](const Tensor& t) {
    if (!t.defined()) return t;
    return rows ? t.narrow(0, first, count) : t.reshape({1, -1}).narrow(1, first, count);
  };
  BatchTensors out;
  out.input_ids = cut(b.input_ids);
  out.labels = cut(b.labels);
  out.weights = cut(b.weights);
  out.sampler_logprobs = cut(b.sampler_logprobs);
  out.advantages = cut(b.advantages);
  out.reference_logprobs = cut(b.reference_logprobs);
  if (rows && b.desirable.defined()) out.desirable = b.desirable.narrow(0, first, count);
  return out;
}

// The objectives whose coefficients the fused head can compute chunk by chunk: per token, or per pair
// of rows when a pair's logits fit a chunk of about 1 GiB (cpo's and orpo's cross-entropy term is a mean
// over the whole batch, and kto's z a mean over all rows: those read the log-probabilities first).
bool OnePass(const objectives::Settings& s, int64_t seq_len, const models::DecoderModel& model) {
  if (objectives::UsesSampler(s.kind)) return true;
  if (s.kind != Kind::kDpo && s.kind != Kind::kSimpo) return false;
  const int64_t pair_bytes = 2 * seq_len * model.config().vocab_size * static_cast<int64_t>(c10::elementSize(model.dtype()));
  return pair_bytes <= (int64_t{1} << 30);
}

}  // namespace

ObjectivePass HeadObjective(const models::DecoderModel& model, const objectives::Settings& settings,
                            const Tensor& hidden, const BatchTensors& batch) {
  ObjectivePass pass;
  pass.tokens = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  const int64_t seq_len = batch.labels.size(1);
  if (OnePass(settings, seq_len, model)) {
    const bool pairs = objectives::PairsRows(settings.kind);
    double loss_sum = 0;
    int64_t count = 0;
    std::map<std::string, double> metric_sums;  // each chunk's figure times its count
    auto weights_of = [&](const Tensor& losses, int64_t start, int64_t rows) {
      const BatchTensors part = pairs ? Slice(batch, start / seq_len, rows / seq_len, true) : Slice(batch, start, rows, false);
      const ObjectiveValue value = EvaluateObjective(settings, (-losses).reshape(part.labels.sizes()), part);
      loss_sum += value.loss_sum;
      count += value.count;
      if (value.count > 0) {
        for (const auto& [name, figure] : value.metrics) metric_sums[name] += figure * static_cast<double>(value.count);
      }
      return (-value.coefficients).reshape({-1});
    };
    Tensor surrogate = model.HeadLossSumWeightedBy(hidden, batch.labels, weights_of, pairs ? 2 * seq_len : 1);
    if (surrogate.defined()) {
      pass.loss_sum = surrogate;
      pass.loss_sum_value = loss_sum;
      pass.count = count;
      for (const auto& [name, sum] : metric_sums) pass.metrics[name] = count > 0 ? sum / static_cast<double>(count) : 0.0;
      return pass;
    }
  }
  const Tensor logprobs = model.HeadLogProbs(hidden, batch.labels);
  ObjectiveValue value = EvaluateObjective(settings, logprobs, batch);
  // Weights -dL/dlp: the head's loss sum(-w lp) then has the objective's gradient.
  pass.loss_sum = model.HeadLossSum(hidden, batch.labels, -value.coefficients);
  pass.loss_sum_value = value.loss_sum;
  pass.count = value.count;
  pass.metrics = std::move(value.metrics);
  return pass;
}

ObjectivePass EvaluateWithoutGradients(const models::DecoderModel& model, const objectives::Settings& settings,
                                       const BatchTensors& batch, Tensor* logprobs) {
  torch::NoGradGuard no_grad;
  *logprobs = model.TokenLogProbs(batch.input_ids, batch.labels);
  ObjectiveValue value = EvaluateObjective(settings, *logprobs, batch);
  ObjectivePass pass;
  pass.tokens = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
  pass.loss_sum_value = value.loss_sum;
  pass.count = value.count;
  pass.metrics = std::move(value.metrics);
  return pass;
}

}  // namespace tigon::engine
