#include "engine/UnitSchedule.h"

#include "engine/ParamHome.h"
#include "sharding/ParamCoordinator.h"

namespace zeroshard {

UnitSchedule::UnitSchedule(const GroupTable& groups, std::unique_ptr<ParamCoordinator> coordinator,
                           std::unique_ptr<ParamHome> home)
    : groups_(groups), home_(std::move(home)), coordinator_(std::move(coordinator)) {
  release_.init(groups_);
}

UnitSchedule::~UnitSchedule() = default;

void UnitSchedule::forward_begin(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->before_forward(u.value);
}

void UnitSchedule::forward_end(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->after_forward(u.value);
}

void UnitSchedule::backward_begin(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->before_backward(u.value);
}

bool UnitSchedule::inputs_need_grad(UnitId unit) {
  if (groups_.coordinator_units(unit).empty()) return false;  // nothing of it is sharded
  return release_.inputs_need_grad(unit, coordinator_->in_backward());
}

void UnitSchedule::inputs_done(UnitId unit) {
  if (!groups_.coordinator_units(unit).empty() && release_.inputs_done(unit))
    release_in_backward(unit);
}

void UnitSchedule::inputs_unknown(UnitId unit) {
  release_.inputs_unknown(unit);
}

void UnitSchedule::grads_done(UnitId unit) {
  if (release_.grads_done(unit)) release_in_backward(unit);
}

void UnitSchedule::release_in_backward(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->backward_done(u.value);
}

void UnitSchedule::model_forward_begin() {
  coordinator_->model_forward_begin();
}

void UnitSchedule::model_forward_end(bool grad_enabled) {
  coordinator_->model_forward_end(grad_enabled);
}

void UnitSchedule::end_forward() {
  coordinator_->end_forward();
}

void UnitSchedule::end_backward() {
  // Gathers first: a rank still inside backward may wait for one, never for a reduction.
  coordinator_->end_backward();
  release_.reset();
}

int UnitSchedule::touch(UnitId unit, bool grad_enabled) {
  std::vector<int> units;
  for (CoordinatorUnit u : groups_.coordinator_units(unit))
    units.push_back(static_cast<int>(u.value));
  if (!units.empty()) coordinator_->touch(units, grad_enabled);
  return held(unit);
}

// The unit's groups held alike, or the least of them.
int UnitSchedule::held(UnitId unit) const {
  auto held = ParamCoordinator::Held::ForUse;
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) {
    const auto h = coordinator_->held(u.value);
    if (h == ParamCoordinator::Held::No) return static_cast<int>(h);
    if (h == ParamCoordinator::Held::ForRead) held = h;
  }
  return static_cast<int>(held);
}

void UnitSchedule::gather(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->gather_now(u.value);
}

void UnitSchedule::release(UnitId unit) {
  for (CoordinatorUnit u : groups_.coordinator_units(unit)) coordinator_->release_now(u.value);
}

}  // namespace zeroshard
