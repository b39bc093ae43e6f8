#include "engine/StepPipeline.h"

#include <cmath>

#include <fmt/format.h>

#include "common/Error.h"
#include "common/FaultPoint.h"
#include "optim/OffloadOptimizer.h"
#include "optim/OverlappedStep.h"
#include "optim/ShardOptimizer.h"
#include "sharding/GradReducer.h"
#include "sharding/LossScaler.h"

namespace zeroshard {

StepPipeline::StepPipeline(const TrainingSettings& settings, int world_size)
    : settings_(settings), world_size_(world_size) {}

StepPipeline::~StepPipeline() = default;

void StepPipeline::set_optimizer(std::unique_ptr<ShardOptimizer> optimizer,
                                 OffloadOptimizer* offloaded, ExternalOptimizer* external) {
  optimizer_ = std::move(optimizer);
  offloaded_ = offloaded;
  external_ = external;
}

void StepPipeline::set_reducer(std::unique_ptr<GradReducer> reducer) {
  reducer_ = std::move(reducer);
}

void StepPipeline::set_scaler(std::unique_ptr<LossScaler> scaler) {
  scaler_ = std::move(scaler);
}

void StepPipeline::overlap_step(int threads) {
  if (!offloaded_) {
    fail(
        "config key 'zero_optimization.offload_optimizer.overlap_step' is true, but the "
        "optimizer is not offloaded; allowed: false or auto, or offload_optimizer.device cpu "
        "or nvme");
  }
  overlapped_ = std::make_unique<OverlappedStep>(offloaded_, threads);
  // The worker takes the gradient once it has landed on the host (GradReducer.h).
  reducer_->on_reduced(
      [this](size_t g) { overlapped_->add(g, [this, g] { return reducer_->settled(g); }); });
}

at::Tensor StepPipeline::begin_backward(const at::Tensor& loss, const Hypers& hypers,
                                        std::optional<c10::Stream> stream) {
  bool counted = true;
  if (++backwards_pending_ == backwards_per_micro_step_) {
    backwards_pending_ = 0;
    ++micro_steps_;
  } else {
    counted = false;
  }
  fault_point("backward.begin");
  const bool boundary = counted && settings_.ends_accumulation(micro_steps_);
  if (boundary && overlapped_) {
    // Everything a group's update reads is fixed now (OverlappedStep.h says why).
    overlapped_->begin(mean_scale(), hypers(), stream);
    hypers_changed_ = false;
  }
  reducer_->begin_backward(boundary);
  return scaler_ ? loss * scaler_->scale() : loss;
}

void StepPipeline::set_backwards_per_micro_step(int backwards) {
  if (backwards < 1 || backwards_pending_ != 0) {
    fail(fmt::format(
        "{} backwards a micro-batch, set after {} of a micro-batch's backwards; allowed: 1 "
        "or more (the number of pipeline stages on this rank), before a micro-batch's first "
        "backward",
        backwards, backwards_pending_));
  }
  backwards_per_micro_step_ = backwards;
}

void StepPipeline::end_backward() {
  reducer_->end_backward();
}

// In bf16 and fp32 too (fp16 has its loss scaler), DeepSpeed skips a window whose
// gradients hold an inf or a NaN, where a step would write NaN into every parameter: at
// stages 1-3 and with bf16 at every stage (bf16.check_grad_overflow, on by default; the
// global norm's check of its ZeRO optimizers and of BF16_Optimizer). fp32 at stage 0 is
// torch's optimizer there, which steps.
static bool skips_non_finite(const TrainingSettings& settings, bool scaled) {
  return !scaled && (settings.stage.shards_optimizer() || settings.compute == Precision::Bf16);
}

bool StepPipeline::update(const Hypers& hypers) {
  if (micro_steps_ == 0 || !settings_.ends_accumulation(micro_steps_)) {
    return false;
  }
  const auto& grads = reducer_->reduced();  // every reduction landed
  double scale = mean_scale();
  if (overlapped_ && overlapped_->pending()) {
    overlapped_->finish();
    if (hypers_changed_) {
      fail(
          "a parameter group's settings changed after the backward that ended the accumulation "
          "window, but zero_optimization.offload_optimizer.overlap_step made that window's "
          "step during that backward, with the old settings; change them before backward, or "
          "set overlap_step false");
    }
    fault_point("step.norm");
    // Reported only (clipping is off here), from the squares CPU Adam summed as it went.
    grad_norm_ = reducer_->global_norm_of(offloaded_->grad_sum_squares(), scale);
    return true;
  }
  // DeepSpeed counts a skipped window in global_steps, but neither its optimizer nor its
  // scheduler advances.
  auto skip = [&] {
    reducer_->zero();
    ++global_offset_;
    ++skipped_steps_;
    return false;
  };
  if (scaler_) {
    scale /= scaler_->scale();
    if (scaler_->update(reducer_->any_overflow())) return skip();
  }
  const double max_norm = settings_.gradient_clipping;
  if (offloaded_ && max_norm <= 0) {
    // Nothing waits for the norm: CPU Adam sums the squares in its own pass over the
    // gradients, and the norm is reported from those. A window whose gradients are not
    // finite is skipped first, as below.
    if (skips_non_finite(settings_, scaler_ != nullptr) && reducer_->any_overflow()) return skip();
    fault_point("step.update");
    optimizer_->step(grads, scale, hypers());
    fault_point("step.norm");
    grad_norm_ = reducer_->global_norm_of(offloaded_->grad_sum_squares(), scale);
    return true;
  }
  fault_point("step.norm");
  grad_norm_ = reducer_->global_norm(scale);
  if (skips_non_finite(settings_, scaler_ != nullptr) && !std::isfinite(grad_norm_)) return skip();
  if (max_norm > 0) {
    const double coefficient = max_norm / (grad_norm_ + 1e-6);  // torch's clip_grad_norm_
    if (coefficient < 1) scale *= coefficient;
  }
  fault_point("step.update");
  optimizer_->step(grads, scale, hypers());
  return true;
}

void StepPipeline::zero_grad() {
  if (overlapped_ && overlapped_->pending()) {
    fail(
        "zero_grad() after the backward that ended an accumulation window, before step(): "
        "zero_optimization.offload_optimizer.overlap_step has made that window's step during "
        "backward already; call step() (or set overlap_step false to discard gradients "
        "there)");
  }
  reducer_->zero();
}

void StepPipeline::hypers_changed() {
  if (overlapped_ && overlapped_->pending()) hypers_changed_ = true;
}

double StepPipeline::loss_scale() const {
  return scaler_ ? scaler_->scale() : 1.0;
}

double StepPipeline::mean_scale() const {
  // Over the ranks that saw different samples: a sequence-parallel group's gradients are
  // summed, as DeepSpeed divides by its data-parallel size alone.
  const int64_t samples_ranks = world_size_ / settings_.sequence_parallel_size;
  return 1.0 / static_cast<double>(samples_ranks * settings_.gradient_accumulation_steps);
}

int64_t StepPipeline::global_steps() const {
  return optimizer_->steps() + global_offset_;
}

int64_t StepPipeline::schedule_steps() const {
  return optimizer_->steps() + schedule_offset_;
}

void StepPipeline::set_global_steps(int64_t steps) {
  global_offset_ = steps - optimizer_->steps();
}

void StepPipeline::set_schedule_steps(int64_t steps) {
  schedule_offset_ = steps - optimizer_->steps();
}

}  // namespace zeroshard
