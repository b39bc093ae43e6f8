#include "common/TaskThread.h"

#include <utility>

namespace zeroshard {

TaskThread::TaskThread(std::function<void()> setup)
    : thread_([this, setup = std::move(setup)] { loop(setup); }) {}

TaskThread::~TaskThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void TaskThread::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  changed_.notify_all();
}

void TaskThread::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void TaskThread::loop(const std::function<void()>& setup) {
  if (setup) setup();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    if (failure_) {  // skipped: wait() reports the first error
      changed_.notify_all();
      continue;
    }
    ++running_;
    lock.unlock();
    try {
      task();
    } catch (...) {
      lock.lock();
      if (!failure_) failure_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    --running_;
    changed_.notify_all();
  }
}

}  // namespace zeroshard
