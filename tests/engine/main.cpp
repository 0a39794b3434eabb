// The engine tests' main: runs gtest, or, when started by a test as its fresh child process, the child's
// part of that test: TIGON_RESUME_CHECKPOINT set (test_checkpoint.cpp), or a rank of a multi-process
// data-parallel test (test_data_parallel_devices.cpp).
#include <gtest/gtest.h>

#include <cstdlib>

namespace tigon {
int ResumeChildMain(const char* checkpoint, const char* output);
bool IsDataParallelRankChild();
int DataParallelRankChildMain();
}

int main(int argc, char** argv) {
  const char* checkpoint = std::getenv("TIGON_RESUME_CHECKPOINT");
  const char* output = std::getenv("TIGON_RESUME_OUTPUT");
  if (checkpoint != nullptr && output != nullptr) return tigon::ResumeChildMain(checkpoint, output);
  if (tigon::IsDataParallelRankChild()) return tigon::DataParallelRankChildMain();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
