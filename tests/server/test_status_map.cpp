#include "server/status_map.h"

#include <gtest/gtest.h>

#include "server/request_cache.h"

namespace tigon::server {
namespace {

TEST(StatusMap, EveryEngineCodeHasItsGrpcCode) {
  const std::pair<tigon::StatusCode, grpc::StatusCode> expected[] = {
      {tigon::StatusCode::kOk, grpc::StatusCode::OK},
      {tigon::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {tigon::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {tigon::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {tigon::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {tigon::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {tigon::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {tigon::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {tigon::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
  };
  for (const auto& [engine, grpc_code] : expected) {
    EXPECT_EQ(ToGrpcCode(engine), grpc_code) << static_cast<int>(engine);
  }
}

TEST(StatusMap, KeepsTheMessage) {
  auto status = ToGrpcStatus(tigon::Status(tigon::StatusCode::kResourceExhausted, "device out of memory: 2 GiB"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "device out of memory: 2 GiB");
  EXPECT_TRUE(ToGrpcStatus(tigon::Status()).ok());
  EXPECT_STREQ(GrpcCodeName(grpc::StatusCode::FAILED_PRECONDITION), "FAILED_PRECONDITION");
}

TEST(RequestCache, ForgetsTheOldestIdsPastItsCapacity) {
  RequestCache cache(3);
  v1::StepResult result;
  for (int i = 0; i < 5; ++i) {
    result.set_step(i);
    cache.Insert("id" + std::to_string(i), "TrainStep", result);
  }
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Find("id0"), nullptr);
  EXPECT_EQ(cache.Find("id1"), nullptr);
  ASSERT_NE(cache.Find("id4"), nullptr);
  EXPECT_EQ(cache.Find("id4")->result.step(), 4);
  EXPECT_EQ(cache.Find("id2")->method, "TrainStep");
  cache.Insert("", "TrainStep", result);  // calls without an id are not remembered
  EXPECT_EQ(cache.size(), 3u);
  cache.Clear();
  EXPECT_EQ(cache.Find("id4"), nullptr);
}

}  // namespace
}  // namespace tigon::server
