// fused_linear_cross_entropy with an explicit chunk size (tests and the benchmark sweep it).
#pragma once

#include <torch/types.h>

#include <cstdint>

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

// Rows per chunk for n tokens, vocabulary `vocab`, hidden size `hidden` and logits of `element_size` bytes.
int64_t DefaultFusedLinearCrossEntropyChunk(int64_t n, int64_t vocab, int64_t hidden, int64_t element_size);

}  // namespace tigon::ops
