#include "engine/OverlappedStep.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>

#include "common/Error.h"
#include "engine/OffloadOptimizer.h"
#include "offload/CpuAdam.h"

namespace zeroshard {

OverlappedStep::OverlappedStep(OffloadOptimizer* optimizer, int threads)
    : optimizer_(optimizer), threads_(threads), worker_([this] { work(); }) {}

OverlappedStep::~OverlappedStep() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void OverlappedStep::begin(double grad_scale, std::vector<AdamHyper> hypers,
                           std::optional<c10::Stream> stream) {
  if (pending_) {
    fail(
        "backward() ended an accumulation window again before step() finished the last one; "
        "with zero_optimization.offload_optimizer.overlap_step that window's step is already "
        "made: call step() after each window's last backward, or set overlap_step false");
  }
  grad_scale_ = grad_scale;
  hypers_ = std::move(hypers);
  stream_ = stream;
  optimizer_->begin_step();
  pending_ = true;
}

void OverlappedStep::add(size_t group, std::function<at::Tensor()> gradient) {
  if (!pending_) fail("overlap_step: group {} is ready outside an overlapped step", group);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({group, std::move(gradient)});
  }
  changed_.notify_all();
}

void OverlappedStep::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  pending_ = false;
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  optimizer_->order_uploads_before_current();  // on the training thread's stream: what runs next
                                               // sees the update
}

void OverlappedStep::work() {
  // Settings that are per thread: gradient mode, OpenMP's thread counts (torch's and, in
  // case it is another runtime, CPU Adam's).
  at::NoGradGuard no_grad;
  at::set_num_threads(threads_);
  set_cpu_adam_threads(threads_);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    try {
      run(task);
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

void OverlappedStep::run(const Task& task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) return;  // the step already failed; finish() reports the first error
  }
  std::optional<c10::StreamGuard> on_stream;
  if (stream_) on_stream.emplace(*stream_);
  optimizer_->step_group(task.group, task.gradient(), grad_scale_, hypers_);
}

}  // namespace zeroshard
