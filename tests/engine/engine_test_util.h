// Helpers for the engine tests: tiny model configs and batches, through engine.h only.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "tigon/engine.h"

namespace tigon::testing {

// A tiny byte-level config of `family` (vocab 256 unless given). head_dim is explicit, since some
// families default it to a constant (Gemma's 256); everything else takes the family's defaults.
inline std::string TinyConfig(const std::string& family = "llama", int hidden = 32, int layers = 2,
                              int vocab = 256) {
  std::string c = "{\"model_type\": \"" + family + "\", \"vocab_size\": " + std::to_string(vocab) +
                  ", \"hidden_size\": " + std::to_string(hidden) +
                  ", \"intermediate_size\": " + std::to_string(2 * hidden) +
                  ", \"num_hidden_layers\": " + std::to_string(layers) +
                  ", \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": " +
                  std::to_string(hidden / 4) +
                  ", \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0"
                  ", \"initializer_range\": 0.05";
  return c + "}";
}

inline SessionOptions TinyOptions(const std::string& precision = "fp32", const std::string& kernels = "fused",
                                  const std::string& family = "llama") {
  SessionOptions o;
  o.config_json = TinyConfig(family);
  o.precision = precision;
  o.kernels = kernels;
  o.seed = 7;
  o.optimizer.lr = 3e-3;
  o.optimizer.weight_decay = 0.01;
  return o;
}

inline Batch RandomBatch(int64_t b, int64_t t, uint64_t seed, int vocab = 256) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  Batch batch;
  batch.batch = b;
  batch.seq_len = t;
  batch.input_ids.resize(static_cast<size_t>(b * t));
  for (auto& id : batch.input_ids) id = static_cast<int32_t>(rng() % vocab);
  return batch;
}

// Rows [row, row + n) of `batch`, with labels made explicit (so a split batch has the same targets).
inline Batch Rows(const Batch& batch, int64_t row, int64_t n) {
  Batch out;
  out.batch = n;
  out.seq_len = batch.seq_len;
  const auto t = batch.seq_len;
  out.input_ids.assign(batch.input_ids.begin() + row * t, batch.input_ids.begin() + (row + n) * t);
  if (!batch.labels.empty()) out.labels.assign(batch.labels.begin() + row * t, batch.labels.begin() + (row + n) * t);
  if (!batch.loss_weights.empty())
    out.loss_weights.assign(batch.loss_weights.begin() + row * t, batch.loss_weights.begin() + (row + n) * t);
  return out;
}

}  // namespace tigon::testing
