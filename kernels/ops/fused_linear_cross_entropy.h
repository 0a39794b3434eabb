// fused_linear_cross_entropy with an explicit chunk size (tests and the benchmark sweep it).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>

#include "kernels/ops/common.h"

namespace tigon::ops {

// chunk_size <= 0 picks DefaultFusedLinearCrossEntropyChunk.
torch::Tensor fused_linear_cross_entropy_chunked(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                 const torch::Tensor& bias, const torch::Tensor& target,
                                                 const CrossEntropyOptions& options, const torch::Tensor& token_weights,
                                                 int64_t chunk_size);

// fused_linear_cross_entropy for a caller that has no further use of hidden (the decoder's final norm
// output): with reduction "mean" or "sum", grad_hidden is written over hidden's own buffer when hidden is
// contiguous, one [N, H] buffer fewer at the end of forward (256 MiB for Llama-3-8B at 32,768 tokens).
// hidden's version is bumped: a node that saved it fails in backward instead of reading gradients.
torch::Tensor fused_linear_cross_entropy_consuming_hidden(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                          const torch::Tensor& bias, const torch::Tensor& target,
                                                          const CrossEntropyOptions& options,
                                                          const torch::Tensor& token_weights);

// Token weights computed from the tokens' own losses, one chunk at a time: losses [rows] (-log p(target),
// 0 where ignored; fp32, fp64 for fp64 inputs) of tokens [start, start + rows) -> their weights [rows].
using ChunkWeightsFn = std::function<torch::Tensor(const torch::Tensor& losses, int64_t start, int64_t rows)>;

// sum over tokens of w * (-log p(target)) where each chunk's w = weights_of(that chunk's losses), with the
// gradient of that sum (w held constant), in one pass over the logits: per chunk the cross-entropy rows
// run twice, losses first, then losses and gradient with the weights, on the same logits. An objective
// whose per-token coefficient depends on the log-probabilities (an importance ratio, a DPO pair's margin)
// thus costs what cross-entropy costs. Chunks hold a multiple of chunk_multiple tokens (whole rows or
// pairs for the objectives that need them). Plain cross-entropy only (no smoothing, z-loss or softcap),
// no bias; hidden is consumed as in fused_linear_cross_entropy_consuming_hidden. chunk_size > 0 sets the
// chunk (then a multiple of chunk_multiple), as fused_linear_cross_entropy_chunked's does.
torch::Tensor fused_linear_cross_entropy_weighted_by(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                     const torch::Tensor& target, const ChunkWeightsFn& weights_of,
                                                     int64_t chunk_multiple, int64_t chunk_size = 0);

// Rows per chunk for n tokens, vocabulary `vocab`, hidden size `hidden` and logits of `element_size` bytes.
int64_t DefaultFusedLinearCrossEntropyChunk(int64_t n, int64_t vocab, int64_t hidden, int64_t element_size);

}  // namespace tigon::ops
