#pragma once
// offload_optimizer.overlap_step: the optimizer step of an accumulation window runs group
// by group inside the backward that ends the window. As GradReducer finishes a group's
// reduced gradient (groups finish last to first, as backward produces them), the group
// goes to one worker thread, which steps it with CPU Adam while the training thread goes
// on with backward and the other groups' reductions; step() then waits for the worker.
// FSDP2 with CPUOffloadPolicy and ZeRO-Offload both step after the whole backward.
//
// Why it is exact: a group's update reads only its own reduced gradient, the step count,
// the hyperparameters and the scale 1/(ranks x accumulation), all fixed when that backward
// begins, so the arithmetic is the serial step's. What needs every gradient first (the
// clipping norm, fp16's overflow check) or shares state with backward (NVMe parameter
// shards) rules the overlap out: config/Config.cpp refuses `true` there and `auto` turns
// off (plan/Planner.cpp resolves it and says why). Hyperparameters changed between that backward
// and step() would come too late for a step already made: step() then fails instead.
//
// The worker runs with the training thread's stream (CUDA) and thread count: its copies
// of updated shards to the device (on a copy stream, docs/architecture.md) start after
// the backward kernels already queued there, and finish() orders them before what the
// training thread's stream runs next.
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include "common/AdamHyper.h"
#include "common/TaskThread.h"

namespace zeroshard {

class OffloadOptimizer;

class OverlappedStep {
 public:
  // `threads`: the intra-op threads the training thread uses (CPU Adam's too).
  OverlappedStep(OffloadOptimizer* optimizer, int threads);
  ~OverlappedStep();
  OverlappedStep(const OverlappedStep&) = delete;
  OverlappedStep& operator=(const OverlappedStep&) = delete;

  // The backward that ends a window begins; `stream`: the training thread's, on a GPU.
  void begin(double grad_scale, std::vector<AdamHyper> hypers, std::optional<c10::Stream> stream);
  // Group `group`'s reduced gradient is final: the worker steps it with what `gradient`
  // returns (it may wait for the gradient's copy to the host, on the worker).
  void add(size_t group, std::function<at::Tensor()> gradient);
  // A step begun and not yet finished.
  bool pending() const { return pending_; }
  // Waits for every group added since begin(); rethrows what failed on the worker.
  void finish();

 private:
  OffloadOptimizer* optimizer_;
  bool pending_ = false;
  double grad_scale_ = 1.0;
  std::vector<AdamHyper> hypers_;
  std::optional<c10::Stream> stream_;
  TaskThread worker_;  // last: its thread reads the members above
};

}  // namespace zeroshard
