#pragma once
// One optimizer step, from the gradients backward produces to this rank's updated
// shards (docs/architecture.md "One step's data path"): the GradReducer collects and
// reduces them in buckets while backward goes on; the LossScaler (fp16) skips a step
// whose gradients overflowed; clipping scales them by the global norm; the optimizer
// updates the shards after backward or, with overlap_step, inside it (OverlappedStep).
// The pipeline counts micro-steps: the update comes at the end of each accumulation
// window. What surrounds it is the engine's: the stage-3 gathers around backward, and
// after the update the gather of updated shards (EngineImpl::finish_step).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include "common/AdamHyper.h"
#include "plan/TrainingSettings.h"

namespace zeroshard {

class GradReducer;
class LossScaler;
class OffloadOptimizer;
class ExternalOptimizer;
class OverlappedStep;
class ShardOptimizer;

class StepPipeline {
 public:
  // The hyperparameters each parameter group steps with now (read only where a step
  // is made: at a window's end).
  using Hypers = std::function<std::vector<AdamHyper>()>;

  StepPipeline(const TrainingSettings& settings, int world_size);
  ~StepPipeline();
  StepPipeline(const StepPipeline&) = delete;
  StepPipeline& operator=(const StepPipeline&) = delete;

  // Made in this order by the engine: the optimizer (the groups are added to it as
  // they are built; `offloaded` is the same object when it is on the host or NVMe), the
  // reducer over the trainable groups, the scaler (fp16), and overlap_step last, on top
  // of the offloaded optimizer and the reducer.
  // `offloaded`, `external`: the optimizer itself when it is of that kind, else null.
  void set_optimizer(std::unique_ptr<ShardOptimizer> optimizer, OffloadOptimizer* offloaded,
                     ExternalOptimizer* external = nullptr);
  void set_reducer(std::unique_ptr<GradReducer> reducer);
  void set_scaler(std::unique_ptr<LossScaler> scaler);
  void overlap_step(int threads);

  ShardOptimizer& optimizer() { return *optimizer_; }
  const ShardOptimizer& optimizer() const { return *optimizer_; }
  OffloadOptimizer* offloaded() { return offloaded_; }
  ExternalOptimizer* external() { return external_; }  // a torch.optim class's
  GradReducer& reducer() { return *reducer_; }
  LossScaler* scaler() { return scaler_.get(); }

  // Backward in two halves, around the engine's own calls: begin counts the micro-step,
  // starts the overlapped step at a window's end and opens the reducer, and returns the
  // loss to differentiate (times fp16's scale); end closes the reducer.
  at::Tensor begin_backward(const at::Tensor& loss, const Hypers& hypers,
                            std::optional<c10::Stream> stream);
  void end_backward();
  // At a window's end: updates this rank's shards and returns true; elsewhere, and when
  // fp16 gradients overflowed (the window is dropped), false.
  bool update(const Hypers& hypers);
  void zero_grad();
  // A parameter group's settings changed: refused at update() if the overlapped step
  // already made this window's update with the old ones.
  void hypers_changed();

  double loss_scale() const;
  double grad_norm() const { return grad_norm_; }
  int64_t micro_steps() const { return micro_steps_; }
  void set_micro_steps(int64_t steps) { micro_steps_ = steps; }
  // Several pipeline stages on this rank (interleaved schedules): each micro-batch runs one
  // backward per stage, and the micro-step is counted at the last of them (the window's
  // last backward ends it). Refused between a micro-batch's backwards.
  void set_backwards_per_micro_step(int backwards);
  // The engine's step count and the config scheduler's position: the optimizer's own
  // count (its bias correction follows it) plus what a checkpoint loaded without the
  // optimizer's state (LoadOptions) set apart from it.
  int64_t global_steps() const;
  int64_t schedule_steps() const;
  void set_global_steps(int64_t steps);
  void set_schedule_steps(int64_t steps);
  // Windows an fp16 overflow dropped (DeepSpeed's skipped_steps; counted in global_steps).
  int64_t skipped_steps() const { return skipped_steps_; }
  void set_skipped_steps(int64_t steps) { skipped_steps_ = steps; }

 private:
  // The reduced gradients are sums over ranks and micro-batches; the step takes their mean.
  double mean_scale() const;

  const TrainingSettings& settings_;
  int world_size_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  OffloadOptimizer* offloaded_ = nullptr;
  ExternalOptimizer* external_ = nullptr;
  std::unique_ptr<OverlappedStep> overlapped_;
  std::unique_ptr<LossScaler> scaler_;
  bool hypers_changed_ = false;  // set during an overlapped step
  double grad_norm_ = 0;
  int64_t micro_steps_ = 0;
  int backwards_per_micro_step_ = 1;
  int backwards_pending_ = 0;  // this micro-step's backwards before its last
  int64_t global_offset_ = 0, schedule_offset_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace zeroshard
