#include "engine/UnitRelease.h"

namespace zeroshard {

void UnitRelease::init(const GroupTable& groups) {
  const size_t n = groups.unit_count();
  trainable_.assign(n, 0);
  frozen_.assign(n, 0);
  for (const GroupRecord& record : groups) {
    if (!record.unit) continue;
    if (record.trainable) {
      ++trainable_[record.unit->value];
    } else {
      frozen_[record.unit->value] = 1;
    }
  }
  reset();
}

bool UnitRelease::inputs_need_grad(UnitId unit, bool recomputed) {
  const size_t u = unit.value;
  if (u >= frozen_.size() || !frozen_[u]) return false;
  if (recomputed && inputs_pending_[u] > 0) return false;
  ++inputs_pending_[u];
  return true;
}

void UnitRelease::inputs_unknown(UnitId unit) {
  // Never reported: the unit stays until reset().
  if (unit.value < frozen_.size() && frozen_[unit.value]) ++inputs_pending_[unit.value];
}

bool UnitRelease::inputs_done(UnitId unit) {
  const size_t u = unit.value;
  if (u >= inputs_pending_.size() || inputs_pending_[u] == 0) return false;
  return --inputs_pending_[u] == 0 && may_go(u);
}

bool UnitRelease::grads_done(UnitId unit) {
  const size_t u = unit.value;
  if (u >= grads_pending_.size()) return false;
  if (grads_pending_[u] > 0) --grads_pending_[u];
  return may_go(u);
}

void UnitRelease::reset() {
  grads_pending_ = trainable_;
  inputs_pending_.assign(trainable_.size(), 0);
}

bool UnitRelease::may_go(size_t unit) const {
  return grads_pending_[unit] == 0 && inputs_pending_[unit] == 0;
}

}  // namespace zeroshard
