#include "sharding/ParamCoordinator.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "common/FaultPoint.h"

namespace zeroshard {

ParamCoordinator::ParamCoordinator(std::vector<FlatParamGroup*> units, Collectives* comm,
                                   const CoordinatorOptions& options)
    : units_(std::move(units)), comm_(comm), options_(options) {
  schedule_.resize(units_.size());
  std::iota(schedule_.begin(), schedule_.end(), 0);
  backward_.assign(schedule_.rbegin(), schedule_.rend());
  used_.assign(units_.size(), false);
  walked_.assign(units_.size(), false);
  pending_.resize(units_.size());
}

const std::vector<size_t>& ParamCoordinator::order() const {
  return phase_ == Phase::Backward ? backward_ : schedule_;
}

size_t ParamCoordinator::position_of(size_t unit) const {
  const auto& o = order();
  return static_cast<size_t>(std::find(o.begin(), o.end(), unit) - o.begin());
}

void ParamCoordinator::begin(Phase phase) {
  phase_ = phase;
  cursor_ = 0;
  std::fill(used_.begin(), used_.end(), false);
  std::fill(walked_.begin(), walked_.end(), false);
  if (phase == Phase::Forward) recorded_.clear();
}

int64_t ParamCoordinator::live_numel() const {
  int64_t live = 0;
  for (const FlatParamGroup* u : units_)
    if (u->gathered()) live += u->numel();
  return live;
}

void ParamCoordinator::launch_gather(size_t unit) {
  walked_[unit] = true;
  FlatParamGroup* u = units_[unit];
  if (u->gathered()) return;  // persistent, or still live from the other phase
  fault_point(phase_ == Phase::Backward ? "backward.gather" : "forward.gather");
  at::NoGradGuard no_grad;
  if (secondary_ != nullptr && phase_ == Phase::Backward && secondary_->holds(unit)) {
    pending_[unit] = secondary_->gather(unit, *u);
    return;
  }
  const bool at_home = home_ != nullptr && home_->holds(unit);
  u->allocate_full(/*fill_own_shard=*/!at_home);
  if (at_home) home_->fill(unit, u->own_slice());
  pending_[unit] = comm_->all_gather(u->flat());
  if (home_ == nullptr || phase_ == Phase::Idle) return;
  const auto& o = order();
  for (size_t p = cursor_; p < std::min(o.size(), cursor_ + lookahead_); ++p) {
    if (home_->holds(o[p])) home_->prefetch(o[p]);
  }
}

void ParamCoordinator::set_shard_home(ShardHome* home, int lookahead) {
  home_ = home;
  lookahead_ = std::max(0, lookahead);
}

void ParamCoordinator::gather_now(size_t unit) {
  launch_gather(unit);
  wait_gathered(unit);
}

void ParamCoordinator::release_now(size_t unit) {
  release(unit, /*even_persistent=*/true);
}

void ParamCoordinator::wait_gathered(size_t unit) {
  pending_[unit].wait();
}

// Issue gathers in schedule order up to and including `unit`; units passed over stay
// live until they are used or the phase ends.
void ParamCoordinator::walk_to(size_t unit) {
  const size_t target = position_of(unit);
  const auto& o = order();
  if (target < o.size()) {
    while (cursor_ <= target) launch_gather(o[cursor_++]);
  } else if (!walked_[unit]) {
    fail("stage 3: unit {} is not in the schedule", unit);
  }
  prefetch();
  wait_gathered(unit);
}

void ParamCoordinator::prefetch() {
  const auto& o = order();
  int64_t budget = options_.prefetch_numel;
  while (cursor_ < o.size()) {
    const FlatParamGroup* next = units_[o[cursor_]];
    if (next->numel() > budget) break;
    if (live_numel() + next->numel() > options_.max_live_numel) break;
    budget -= next->numel();
    launch_gather(o[cursor_++]);
  }
}

void ParamCoordinator::release(size_t unit, bool even_persistent) {
  pending_[unit].wait();
  FlatParamGroup* u = units_[unit];
  if (!even_persistent && u->numel() <= options_.persistence_numel) return;
  if (secondary_ != nullptr && phase_ == Phase::Forward && u->gathered()) {
    at::NoGradGuard no_grad;
    secondary_->keep(unit, *u);
  }
  u->release_full();
}

void ParamCoordinator::before_forward(size_t unit) {
  if (phase_ != Phase::Forward) begin(Phase::Forward);
  if (!used_[unit]) recorded_.push_back(unit);
  used_[unit] = true;
  if (walked_[unit]) {
    if (!units_[unit]->gathered()) launch_gather(unit);  // reused after release
    prefetch();
    wait_gathered(unit);
    return;
  }
  walk_to(unit);
}

// The last unit of forward is the first of backward: it stays (on every rank alike).
void ParamCoordinator::after_forward(size_t unit) {
  fault_point("forward.release");
  if (unit != schedule_.back()) release(unit);
}

void ParamCoordinator::end_forward() {
  if (phase_ != Phase::Forward) begin(Phase::Forward);
  // Units this rank did not run are gathered and freed too: the other ranks may have.
  const auto& o = order();
  while (cursor_ < o.size()) launch_gather(o[cursor_++]);
  for (size_t u = 0; u < units_.size(); ++u)
    if (u != schedule_.back()) release(u);
  begin(Phase::Backward);
}

void ParamCoordinator::before_backward(size_t unit) {
  if (phase_ != Phase::Backward) begin(Phase::Backward);
  used_[unit] = true;
  if (walked_[unit]) {
    prefetch();
    wait_gathered(unit);
    return;
  }
  walk_to(unit);
}

void ParamCoordinator::backward_done(size_t unit) {
  if (phase_ == Phase::Backward) release(unit);
}

bool ParamCoordinator::advance() {
  const auto& o = order();
  if (phase_ == Phase::Idle || cursor_ >= o.size()) return false;
  launch_gather(o[cursor_++]);
  return true;
}

void ParamCoordinator::end_backward() {
  const auto& o = backward_;
  while (cursor_ < o.size()) launch_gather(o[cursor_++]);
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  if (secondary_ != nullptr) secondary_->invalidate();
  phase_ = Phase::Idle;
}

void ParamCoordinator::after_step() {
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*even_persistent=*/true);
  if (secondary_ != nullptr) secondary_->invalidate();
  // Rank 0's first-use order, then every unit it did not use, in registration order.
  std::vector<int64_t> mine(recorded_.begin(), recorded_.end());
  for (size_t u = 0; u < units_.size(); ++u)
    if (std::find(recorded_.begin(), recorded_.end(), u) == recorded_.end()) mine.push_back(u);
  fault_point("step.schedule");
  at::Tensor order = at::tensor(mine, at::kLong);
  comm_->broadcast(order, 0).wait();
  const auto* data = order.data_ptr<int64_t>();
  schedule_.assign(data, data + order.numel());
  backward_.assign(schedule_.rbegin(), schedule_.rend());
}

}  // namespace zeroshard
