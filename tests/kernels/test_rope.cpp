// RoPE on q and k together: the fused CPU path (tigon::ops) against Hugging Face's apply_rotary_pos_emb
// (tigon::reference), forward and gradients, with [T, D] / [B, T, D] / [1, T, D] tables, the transposed
// [B, T, H, D] -> [B, H, T, D] layout Hugging Face produces, and non-contiguous incoming gradients (the
// layout bug the Liger paper reports for RoPE's backward).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Optional.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops/ops.h"
#include "kernels/reference/reference.h"
#include "tests/kernels/expect_close.h"

namespace {

using tigon_test::ExpectClose;

// Hugging Face's default rotary tables for positions first_position.. : cat(freqs, freqs), [T, D].
std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t seq_len, int64_t head_dim, torch::ScalarType dtype,
                                                     int64_t first_position = 0) {
  auto inv_freq = 1.0 / torch::pow(10000.0, torch::arange(0, head_dim, 2, torch::kDouble) / head_dim);
  auto positions = torch::arange(first_position, first_position + seq_len, torch::kDouble);
  auto freqs = torch::outer(positions, inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

struct Case {
  int64_t batch, q_heads, k_heads, seq_len, head_dim;
  int table_dims;  // 2: [T, D]; 3: [B, T, D]; 1: [1, T, D]
};
const Case kCases[] = {{2, 4, 2, 7, 6, 2}, {1, 3, 1, 1, 128, 3}, {3, 2, 2, 5, 10, 1}, {2, 8, 8, 9, 64, 3}};

std::string Describe(const Case& c) {
  return "B" + std::to_string(c.batch) + " Hq" + std::to_string(c.q_heads) + " Hk" + std::to_string(c.k_heads) + " T" +
         std::to_string(c.seq_len) + " D" + std::to_string(c.head_dim) + " table" + std::to_string(c.table_dims);
}

// random: arbitrary tables (halves differ), which checks the general rotation and its transpose.
// [B, T, D] tables give every sequence its own positions (packed or left-padded batches).
std::pair<torch::Tensor, torch::Tensor> TablesFor(const Case& c, torch::ScalarType dtype, bool random) {
  auto one_table = [&](int64_t first_position) {
    if (random) {
      return std::make_pair(torch::randn({c.seq_len, c.head_dim}, dtype), torch::randn({c.seq_len, c.head_dim}, dtype));
    }
    return RotaryTables(c.seq_len, c.head_dim, dtype, first_position);
  };
  if (c.table_dims != 3) {
    auto [cos, sin] = one_table(0);
    if (c.table_dims == 1) return {cos.unsqueeze(0), sin.unsqueeze(0)};
    return {cos, sin};
  }
  std::vector<torch::Tensor> cos, sin;
  for (int64_t b = 0; b < c.batch; ++b) {
    auto [cb, sb] = one_table(3 * b);
    cos.push_back(cb);
    sin.push_back(sb);
  }
  return {torch::stack(cos), torch::stack(sin)};
}

TEST(RopeCpu, ForwardMatchesReference) {
  torch::manual_seed(301);
  for (const auto& c : kCases) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      auto q = torch::randn({c.batch, c.q_heads, c.seq_len, c.head_dim}).to(dtype);
      auto k = torch::randn({c.batch, c.k_heads, c.seq_len, c.head_dim}).to(dtype);
      auto [cos, sin] = TablesFor(c, dtype, /*random=*/false);
      auto [q_out, k_out] = tigon::ops::rope(q, k, cos, sin);
      auto [q_ref, k_ref] = tigon::reference::rope(q.to(torch::kDouble), k.to(torch::kDouble), cos.to(torch::kDouble),
                                                   sin.to(torch::kDouble));
      EXPECT_EQ(q_out.scalar_type(), dtype);
      EXPECT_EQ(k_out.scalar_type(), dtype);
      // fp32: two products and a sum per element (a few ulps); bf16: one rounding of the output (2^-8
      // relative), atol for outputs near zero where the two products cancel.
      const double atol = dtype == torch::kFloat ? 1e-6 : 1e-2;
      const double rtol = dtype == torch::kFloat ? 1e-5 : 1e-2;
      ExpectClose(q_out, q_ref, atol, rtol, Describe(c) + " q");
      ExpectClose(k_out, k_ref, atol, rtol, Describe(c) + " k");
    }
  }
}

TEST(RopeCpu, GradientsMatchReferenceAutogradFloat64) {
  torch::manual_seed(302);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto& c : kCases) {
    for (bool random_tables : {false, true}) {
      // q and k as Hugging Face makes them: [B, T, H, D] projections viewed as [B, H, T, D].
      auto q = torch::randn({c.batch, c.seq_len, c.q_heads, c.head_dim}, opts).transpose(1, 2).requires_grad_(true);
      auto k = torch::randn({c.batch, c.seq_len, c.k_heads, c.head_dim}, opts).transpose(1, 2).requires_grad_(true);
      auto [cos, sin] = TablesFor(c, torch::kDouble, random_tables);
      auto [q_out, k_out] = tigon::ops::rope(q, k, cos, sin);
      auto [q_ref, k_ref] = tigon::reference::rope(q, k, cos, sin);
      ExpectClose(q_out, q_ref, 1e-12, 1e-10, Describe(c) + " q forward");
      ExpectClose(k_out, k_ref, 1e-12, 1e-10, Describe(c) + " k forward");
      // Incoming gradients laid out [B, T, H, D] (as from SDPA's backward), i.e. non-contiguous here.
      auto dq = torch::randn({c.batch, c.seq_len, c.q_heads, c.head_dim}, opts).transpose(1, 2);
      auto dk = torch::randn({c.batch, c.seq_len, c.k_heads, c.head_dim}, opts).transpose(1, 2);
      auto g = torch::autograd::grad({q_out, k_out}, {q, k}, {dq, dk});
      auto g_ref = torch::autograd::grad({q_ref, k_ref}, {q, k}, {dq, dk});
      const std::string what = Describe(c) + (random_tables ? " random tables" : " rotary tables");
      ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, what + " dq");
      ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, what + " dk");
    }
  }
}

TEST(RopeCpu, OnlyOneOutputUsedInLoss) {
  torch::manual_seed(303);
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({1, 2, 3, 8}, opts).requires_grad_(true);
  auto k = torch::randn({1, 1, 3, 8}, opts).requires_grad_(true);
  auto [cos, sin] = RotaryTables(3, 8, torch::kDouble);
  auto [q_out, k_out] = tigon::ops::rope(q, k, cos, sin);
  auto [q_ref, k_ref] = tigon::reference::rope(q, k, cos, sin);
  auto dq = torch::randn(q.sizes(), opts);
  auto g = torch::autograd::grad({q_out}, {q, k}, {dq}, /*retain_graph=*/c10::nullopt, /*create_graph=*/false,
                                 /*allow_unused=*/true);
  auto g_ref = torch::autograd::grad({q_ref}, {q, k}, {dq}, c10::nullopt, false, true);
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "dq");
  // k did not reach the loss: its gradient is zero (or absent), never garbage.
  if (g[1].defined()) EXPECT_EQ(g[1].abs().max().item<double>(), 0.0);
}

TEST(RopeCpu, RegisteredTorchOpRunsWithAutograd) {
  torch::manual_seed(304);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("tigon::rope", "")
                .typed<std::tuple<torch::Tensor, torch::Tensor>(const torch::Tensor&, const torch::Tensor&,
                                                                const torch::Tensor&, const torch::Tensor&)>();
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto q = torch::randn({2, 2, 4, 16}, opts).requires_grad_(true);
  auto k = torch::randn({2, 1, 4, 16}, opts).requires_grad_(true);
  auto [cos, sin] = RotaryTables(4, 16, torch::kDouble);
  auto [q_out, k_out] = op.call(q, k, cos, sin);
  auto [q_ref, k_ref] = tigon::reference::rope(q, k, cos, sin);
  ExpectClose(q_out, q_ref, 1e-12, 1e-10, "torch op q");
  auto loss = (q_out * q_out).sum() + (k_out * 3.0).sum();
  auto loss_ref = (q_ref * q_ref).sum() + (k_ref * 3.0).sum();
  auto g = torch::autograd::grad({loss}, {q, k});
  auto g_ref = torch::autograd::grad({loss_ref}, {q, k});
  ExpectClose(g[0], g_ref[0], 1e-12, 1e-10, "torch op dq");
  ExpectClose(g[1], g_ref[1], 1e-12, 1e-10, "torch op dk");
}

TEST(RopeCpu, RejectsBadShapes) {
  auto q = torch::randn({1, 2, 3, 8});
  auto k = torch::randn({1, 1, 3, 8});
  auto [cos, sin] = RotaryTables(3, 8, torch::kFloat);
  EXPECT_THROW(tigon::ops::rope(q, k, cos.slice(0, 0, 2), sin.slice(0, 0, 2)), c10::Error);  // T mismatch
  EXPECT_THROW(tigon::ops::rope(torch::randn({1, 2, 3, 7}), torch::randn({1, 1, 3, 7}), torch::randn({3, 7}),
                                torch::randn({3, 7})),
               c10::Error);  // odd head dim
  EXPECT_THROW(tigon::ops::rope(q, torch::randn({1, 1, 4, 8}), cos, sin), c10::Error);
}

}  // namespace
