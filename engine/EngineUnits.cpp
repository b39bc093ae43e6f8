// Stage-3 units driven from outside the Engine (run_unit for LibTorch modules, the
// unit_* calls for Python's module hooks), and parameters written outside training.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "common/Error.h"
#include "engine/Communicators.h"
#include "engine/EngineImpl.h"
#include "engine/ParamHome.h"
#include "engine/StepPipeline.h"
#include "engine/UnitSchedule.h"
#include "optim/ShardOptimizer.h"
#include "sharding/Collectives.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {

at::Tensor EngineImpl::run_unit(const torch::nn::Module& unit,
                                const std::function<at::Tensor()>& forward) {
  if (!units_) return forward();
  const std::optional<UnitId> found = groups_.unit_of(unit);
  if (!found) {
    fail(
        "run_unit: module '{}' is not a stage-3 unit: engine/UnitPartition.h says which "
        "modules gather one; run one of those, or declare this one in EngineOptions::units",
        unit.name());
  }
  const UnitId u = *found;
  units_->forward_begin(u);
  at::Tensor out = forward();
  if (out.requires_grad()) {
    units_->inputs_unknown(u);
    out.register_hook([this, u](const at::Tensor& grad) {
      units_->backward_begin(u);
      return grad;
    });
  }
  units_->forward_end(u);
  return out;
}

UnitSchedule* EngineImpl::schedule_of(size_t unit) const {
  groups_.coordinator_units(UnitId(unit));  // fails if none such
  return units_.get();
}

void EngineImpl::unit_forward_begin(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->forward_begin(UnitId(unit));
}

void EngineImpl::unit_forward_end(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->forward_end(UnitId(unit));
}

void EngineImpl::unit_backward_begin(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->backward_begin(UnitId(unit));
}

bool EngineImpl::unit_inputs_need_grad(size_t unit) {
  UnitSchedule* s = schedule_of(unit);
  return s && s->inputs_need_grad(UnitId(unit));
}

void EngineImpl::unit_inputs_done(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->inputs_done(UnitId(unit));
}

void EngineImpl::model_forward_begin() {
  buffers_->forward_begin(comms_->data_parallel());
  if (units_) units_->model_forward_begin();
}

void EngineImpl::model_forward_end(bool grad_enabled) {
  // This forward's backward reduces gradients when it ends the accumulation window.
  buffers_->forward_end(grad_enabled &&
                        plan_.settings.ends_accumulation(pipeline_->micro_steps() + 1));
  if (units_) units_->model_forward_end(grad_enabled);
}

int EngineImpl::touch_unit(size_t unit, bool grad_enabled) {
  UnitSchedule* s = schedule_of(unit);
  return s ? s->touch(UnitId(unit), grad_enabled) : unit_held(unit);
}

int EngineImpl::unit_held(size_t unit) const {
  const UnitSchedule* s = schedule_of(unit);
  return s ? s->held(UnitId(unit)) : static_cast<int>(ParamCoordinator::Held::ForUse);
}

void EngineImpl::gather_unit(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->gather(UnitId(unit));
}

void EngineImpl::release_unit(size_t unit) {
  if (UnitSchedule* s = schedule_of(unit)) s->release(UnitId(unit));
}

// A gradient of a stage-3 parameter whose unit was never gathered for a use this step
// comes from a read of the placeholder (NaN) it holds between uses: a C++ program that
// read the parameter outside run_unit. Said here rather than trained on.
void EngineImpl::check_read(size_t trainable_group, size_t slot) const {
  const GroupRecord& g = groups_.of_trainable(TrainableId(trainable_group));
  if (!g.coordinator_unit || units_->coordinator().read_this_step(g.coordinator_unit->value))
    return;
  fail(
      "stage 3: parameter '{}' got a gradient, but its unit was not gathered in this step, so "
      "what read it read the placeholder a sharded parameter holds between uses; run every "
      "read of a unit's parameters through Engine::run_unit with one of the unit's modules "
      "(engine/UnitPartition.h says which)",
      g.flat->slots().at(slot).name);
}

void EngineImpl::commit_parameters(int src_rank) {
  if (src_rank < 0 || src_rank >= data_parallel_size()) {
    fail("modifier rank {} does not exist; allowed: 0 to {} (data-parallel ranks)", src_rank,
         data_parallel_size() - 1);
  }
  at::NoGradGuard no_grad;
  std::vector<CommHandle> handles;
  // An expert group from the rank of its own edp group placed as the modifier is in its
  // (data-parallel rank = edp coordinate x ep + ep coordinate): each ep rank's experts.
  const int ep = static_cast<int>(plan_.settings.expert_parallel_size);
  for (const auto& record : groups_) {
    const auto& g = record.flat;
    if (g->sharded() && !g->gathered()) continue;
    handles.push_back(comms_->broadcasts(record.expert)
                          .broadcast(g->flat(), record.expert ? src_rank / ep : src_rank));
  }
  for (auto& h : handles) h.wait();
  for (size_t i = 0; i < groups_.trainable().size(); ++i) {
    FlatParamGroup* g = &trainable_group(i);
    const int u = unit_of_trainable(i);
    if (g->sharded() && !g->gathered()) continue;
    ShardUpdate update(param_home(), u);
    if (g->sharded()) g->keep_own_slice();
    pipeline_->optimizer().reload_master(i);
  }
  for (const GroupRecord& record : groups_) {  // frozen units: their shard only
    FlatParamGroup* g = record.flat.get();
    if (!record.trainable && !g->sharded()) g->requantize_whole();  // kept quantized
    if (record.trainable || !g->sharded() || !g->gathered()) continue;
    ShardUpdate update(param_home(), static_cast<int>(record.coordinator_unit->value));
    g->keep_own_slice();
  }
  if (ParamHome* home = param_home()) home->flush();
}

}  // namespace zeroshard
