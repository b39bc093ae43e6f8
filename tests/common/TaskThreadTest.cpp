// TaskThread: tasks run in order on a thread of their own, set up first; wait() sees
// them all done and rethrows the first failure, skipping what was queued after it; the
// thread takes new tasks after a failure; the destructor runs what is still queued.
#include "common/TaskThread.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

using namespace zeroshard;

namespace {
thread_local int setting = 0;  // what the setup writes, per thread
}  // namespace

TEST(TaskThread, RunsTasksInOrderOnItsOwnSetUpThread) {
  std::vector<int> order;
  std::thread::id ran_on;
  int seen_setting = 0;
  TaskThread worker([] { setting = 7; });
  for (int i = 0; i < 5; ++i) {
    worker.post([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5 - i));  // later ones quicker
      order.push_back(i);
      ran_on = std::this_thread::get_id();
      seen_setting = setting;
    });
  }
  worker.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(seen_setting, 7);
  EXPECT_EQ(setting, 0);  // the caller's own is untouched
}

TEST(TaskThread, WaitRethrowsTheFirstFailureAndSkipsWhatCameAfterIt) {
  TaskThread worker;
  std::atomic<int> ran{0};
  worker.post([&] { ++ran; });
  worker.post([] { throw std::runtime_error("first"); });
  worker.post([] { throw std::runtime_error("second"); });
  worker.post([&] { ++ran; });
  try {
    worker.wait();
    FAIL() << "wait() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "first");
  }
  EXPECT_EQ(ran.load(), 1);
  worker.post([&] { ++ran; });  // a new round after the failure
  EXPECT_NO_THROW(worker.wait());
  EXPECT_EQ(ran.load(), 2);
}

TEST(TaskThread, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    TaskThread worker;
    for (int i = 0; i < 3; ++i)
      worker.post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++ran;
      });
  }
  EXPECT_EQ(ran.load(), 3);
}
