// SessionSequence: numbered calls run in their number's order whatever order they arrive in; a retried
// number runs at once; a call that gives up waiting lets the later ones through; a number that never
// comes stops its stream.
#include "server/session_sequence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace tigon::server {
namespace {

using namespace std::chrono_literals;

SessionSequence::Limits Limits(std::chrono::milliseconds gap = 5000ms, std::chrono::milliseconds deadline = 60000ms) {
  return {std::chrono::system_clock::now() + deadline, [] { return false; },
          std::chrono::duration<double>(gap).count()};
}

TEST(SessionSequence, CallsRunInTheirNumbersOrderWhateverOrderTheyArriveIn) {
  SessionSequence sequence;
  std::mutex mu;
  std::vector<int> ran;
  std::vector<std::thread> threads;
  for (int number : {5, 3, 1, 4, 2}) {  // arrival order
    threads.emplace_back([&, number] {
      SessionSequence::Turn turn;
      ASSERT_TRUE(sequence.WaitForTurn("a", number, Limits(), &turn).ok());
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(number);
    });
    std::this_thread::sleep_for(10ms);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4, 5}));
}

TEST(SessionSequence, StreamsAndUnorderedCallsDoNotWaitForEachOther) {
  SessionSequence sequence;
  SessionSequence::Turn a1, b1, none;
  ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), &a1).ok());
  ASSERT_TRUE(sequence.WaitForTurn("b", 1, Limits(), &b1).ok());  // another client's stream
  ASSERT_TRUE(sequence.WaitForTurn("a", 0, Limits(), &none).ok());  // not ordered
}

TEST(SessionSequence, ARetriedNumberRunsAtOnce) {
  SessionSequence sequence;
  {
    SessionSequence::Turn turn;
    ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), &turn).ok());
    SessionSequence::Turn retry_while_running;
    ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), &retry_while_running).ok());
  }
  SessionSequence::Turn retry_after;
  ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), &retry_after).ok());
  SessionSequence::Turn next;
  ASSERT_TRUE(sequence.WaitForTurn("a", 2, Limits(), &next).ok());
}

TEST(SessionSequence, ACallWhoseDeadlinePassesWhileWaitingLetsTheLaterOnesThrough) {
  SessionSequence sequence;
  auto first = std::make_unique<SessionSequence::Turn>();
  ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), first.get()).ok());
  SessionSequence::Turn second;
  const grpc::Status late = sequence.WaitForTurn("a", 2, Limits(5000ms, 50ms), &second);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  std::atomic<bool> third_ran{false};
  std::thread third([&] {
    SessionSequence::Turn turn;
    EXPECT_TRUE(sequence.WaitForTurn("a", 3, Limits(), &turn).ok());
    third_ran = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(third_ran) << "3 waits for 1, still running";
  first.reset();
  third.join();
  EXPECT_TRUE(third_ran);
}

TEST(SessionSequence, ANumberThatNeverComesStopsItsStream) {
  SessionSequence sequence;
  SessionSequence::Turn turn;
  ASSERT_TRUE(sequence.WaitForTurn("a", 1, Limits(), &turn).ok());
  turn = SessionSequence::Turn();  // 1 finished; 2 is lost
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status third = sequence.WaitForTurn("a", 3, Limits(100ms), &turn);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(third.error_message().find("call 2"), std::string::npos) << third.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_EQ(sequence.WaitForTurn("a", 2, Limits(), &turn).error_code(), grpc::StatusCode::ABORTED);  // too late
  EXPECT_EQ(sequence.WaitForTurn("a", 4, Limits(), &turn).error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(sequence.WaitForTurn("fresh", 1, Limits(), &turn).ok());  // the client's next stream
}

}  // namespace
}  // namespace tigon::server
