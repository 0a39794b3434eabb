// The engine tests' main: runs gtest, or, when started by a test as its fresh child process
// (TIGON_RESUME_CHECKPOINT set), the child's part of that test.
#include <gtest/gtest.h>

#include <cstdlib>

namespace tigon {
int ResumeChildMain(const char* checkpoint, const char* output);
}

int main(int argc, char** argv) {
  const char* checkpoint = std::getenv("TIGON_RESUME_CHECKPOINT");
  const char* output = std::getenv("TIGON_RESUME_OUTPUT");
  if (checkpoint != nullptr && output != nullptr) return tigon::ResumeChildMain(checkpoint, output);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
