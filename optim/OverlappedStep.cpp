#include "optim/OverlappedStep.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>

#include "common/Error.h"
#include "offload/CpuAdam.h"
#include "optim/OffloadOptimizer.h"

namespace zeroshard {

// The worker's settings are per thread: gradient mode, OpenMP's thread counts (torch's
// and, in case it is another runtime, CPU Adam's).
OverlappedStep::OverlappedStep(OffloadOptimizer* optimizer, int threads)
    : optimizer_(optimizer), worker_([threads] {
        at::GradMode::set_enabled(false);
        at::set_num_threads(threads);
        set_cpu_adam_threads(threads);
      }) {}

OverlappedStep::~OverlappedStep() = default;

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
  worker_.post([this, group, gradient = std::move(gradient)] {
    std::optional<c10::StreamGuard> on_stream;
    if (stream_) on_stream.emplace(*stream_);
    optimizer_->step_group(group, gradient(), grad_scale_, hypers_);
  });
}

void OverlappedStep::finish() {
  pending_ = false;
  worker_.wait();  // rethrows what failed on the worker
  // On the training thread's stream: what runs next sees the update.
  optimizer_->order_uploads_before_current();
}

}  // namespace zeroshard
