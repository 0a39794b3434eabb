// Inputs the fuzz targets (fuzz/) found problems with, kept as ordinary tests. Each input also stays in
// fuzz/corpus/fuzz_request/ under the name given here.
#include <gtest/gtest.h>

#include <limits>

#include "server/validation.h"

namespace tigon::server {
namespace {

// fuzz/corpus/fuzz_request/train_huge_shape_unlimited: with --max-batch-tokens at its largest value,
// batch * seq_len = 2^33 * 2^31 overflowed int64 (undefined behaviour; in practice it wrapped to 0, so
// the batch passed the token limit and was refused for a confusing "batch * seq_len = 0").
TEST(FuzzRegressions, BatchTokenProductThatOverflowsInt64IsOverTheLimit) {
  const BatchLimits limits{/*vocab_size=*/256, /*max_position_embeddings=*/0,
                           /*max_batch_tokens=*/std::numeric_limits<int64_t>::max()};
  v1::Batch batch;
  batch.set_batch(int64_t{1} << 33);
  batch.set_seq_len(int64_t{1} << 31);
  batch.add_input_ids(1);
  const grpc::Status status = ValidateBatch(batch, limits);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("8589934592 x 2147483648 tokens"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(ValidateBatchShape(int64_t{1} << 62, 4, limits).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(ValidateBatchShape(int64_t{1} << 31, int64_t{1} << 31, limits).ok());
}

}  // namespace
}  // namespace tigon::server
