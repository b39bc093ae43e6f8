#pragma once
// One thread that runs the tasks posted to it, in the order posted, while the poster goes
// on. wait() blocks until every task posted so far has run and rethrows the first one's
// exception; after a failure the tasks still queued are skipped, so the caller reports
// the first error rather than its consequences. The thread is ready for new tasks after
// wait(), failed or not.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace zeroshard {

class TaskThread {
 public:
  // `setup` runs first, on the new thread: its thread-local settings.
  explicit TaskThread(std::function<void()> setup = {});
  ~TaskThread();  // runs what is queued, then joins
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  void post(std::function<void()> task);
  void wait();

 private:
  void loop(const std::function<void()>& setup);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;  // tasks taken off the queue and not done
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace zeroshard
