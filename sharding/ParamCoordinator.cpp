#include "sharding/ParamCoordinator.h"

#include <algorithm>
#include <numeric>

#include <ATen/ATen.h>

#include "common/Error.h"
#include "common/FaultPoint.h"

namespace zeroshard {

ParamCoordinator::ParamCoordinator(std::vector<FlatParamGroup*> units, Collectives* comm,
                                   Collectives* touch_comm, const CoordinatorOptions& options)
    : units_(std::move(units)),
      comm_(comm),
      touch_comm_(touch_comm != nullptr ? touch_comm : comm),
      options_(options) {
  const size_t n = units_.size();
  schedule_.forward.resize(n);
  std::iota(schedule_.forward.begin(), schedule_.forward.end(), 0);
  schedule_.backward.assign(schedule_.forward.rbegin(), schedule_.forward.rend());
  schedule_.uses.assign(n, 1);
  record_.uses.assign(n, 0);
  record_.last_use.assign(n, 0);
  state_.resize(n);
}

const std::vector<size_t>& ParamCoordinator::order() const {
  return phase_ == Phase::Backward ? schedule_.backward : schedule_.forward;
}

size_t ParamCoordinator::position_of(size_t unit) const {
  const auto& o = order();
  return static_cast<size_t>(std::find(o.begin(), o.end(), unit) - o.begin());
}

void ParamCoordinator::begin(Phase phase) {
  release_idle_touches();
  phase_ = phase;
  cursor_ = 0;
  for (auto& s : state_) s.walked = s.used = false;
  if (phase != Phase::Forward) return;
  record_.first_use.clear();
  std::fill(record_.uses.begin(), record_.uses.end(), 0);
  std::fill(record_.last_use.begin(), record_.last_use.end(), 0);
  record_.tick = 0;
  for (auto& s : state_) s.active = 0;
}

int64_t ParamCoordinator::live_numel() const {
  int64_t live = 0;
  for (const FlatParamGroup* u : units_)
    if (u->gathered()) live += u->numel();
  return live;
}

// `explicit_comm`: a gather outside the walk (gather_now), over that group (a unit's own
// touches group where it has one) and from the primary shards only.
void ParamCoordinator::launch_gather(size_t unit, Collectives* explicit_comm) {
  state_[unit].walked = true;
  FlatParamGroup* u = units_[unit];
  if (u->gathered()) return;  // persistent, kept, or still live from the other phase
  fault_point(phase_ == Phase::Backward ? "backward.gather" : "forward.gather");
  at::NoGradGuard no_grad;
  const bool in_walk = explicit_comm == nullptr;
  // Every rank gathers the same unit here: its number and first parameter say which.
  const CollectiveLabel label(u->slots().empty()
                                  ? fmt::format("unit {}", unit)
                                  : fmt::format("unit {}: {}", unit, u->slots().front().name));
  if (in_walk && secondary_ != nullptr && phase_ == Phase::Backward && secondary_->holds(unit)) {
    state_[unit].pending = secondary_->gather(unit, *u);
    return;
  }
  const bool at_home = home_.shards != nullptr && home_.shards->holds(unit);
  u->allocate_full(/*fill_own_shard=*/!at_home);
  if (at_home) home_.shards->fill(unit, u->own_slice());
  // Tests: this rank leaves the gather out (its own shard only), as a bug in its walk would.
  if (fault_skip(phase_ == Phase::Backward ? "backward.gather" : "forward.gather")) return;
  Collectives* over = in_walk ? comm_ : explicit_comm;
  if (!others_.gathers.empty() && others_.gathers[unit] != nullptr)
    over = in_walk ? others_.gathers[unit] : others_.touches[unit];
  state_[unit].pending = over->all_gather(u->flat());
  if (home_.shards == nullptr || phase_ == Phase::Idle || !in_walk) return;
  const auto& o = order();
  for (size_t p = cursor_; p < std::min(o.size(), cursor_ + home_.lookahead); ++p) {
    if (home_.shards->holds(o[p])) home_.shards->prefetch(o[p]);
  }
}

void ParamCoordinator::set_shard_home(ShardHome* home, int lookahead) {
  home_.shards = home;
  home_.lookahead = std::max(0, lookahead);
}

void ParamCoordinator::gather_now(size_t unit) {
  // Already there (persistent, or held for a read: alike on every rank), it is only kept:
  // for use, until release_now, not until the next read of another unit.
  idle_touched_.erase(std::remove(idle_touched_.begin(), idle_touched_.end(), unit),
                      idle_touched_.end());
  if (!gathered(unit)) gather_for_read(unit);
  state_[unit].held_for_use = true;
}

void ParamCoordinator::gather_for_read(size_t unit) {
  state_[unit].read = true;
  try {
    launch_gather(unit, touch_comm_);  // check_collectives waits here already
    wait_gathered(unit);
  } catch (const Error& e) {
    fail(
        "{}; a stage-3 parameter read outside forward and backward is gathered by every rank "
        "together, as gathered_parameters is: every rank must read the same parameters in "
        "the same order",
        e.what());
  }
}

void ParamCoordinator::release_now(size_t unit) {
  release(unit, /*even_persistent=*/true);
}

void ParamCoordinator::wait_gathered(size_t unit) {
  state_[unit].pending.wait();
}

// Issue gathers in schedule order up to and including `unit`. A unit the walk passes
// over is one rank 0 used before and this rank did not (a branch not taken, a vision tower
// a text-only batch skips, the encoder during generation's decoder steps, or the
// registration order before rank 0's arrives): gathered only to keep the ranks in step,
// it goes at once.
void ParamCoordinator::walk_to(size_t unit) {
  const size_t target = position_of(unit);
  const auto& o = order();
  if (target < o.size()) {
    while (cursor_ <= target) {
      const size_t next = o[cursor_++];
      const bool passed = next != unit && !units_[next]->gathered();
      launch_gather(next);
      if (passed) release(next);
    }
  } else if (!state_[unit].walked) {
    fail("stage 3: unit {} is not in the schedule", unit);
  }
  prefetch();
  wait_gathered(unit);
}

// The rest of the phase's walk: units this rank did not use, gathered for the ranks that
// did, one at a time.
void ParamCoordinator::walk_rest() {
  const auto& o = order();
  while (cursor_ < o.size()) {
    const size_t next = o[cursor_++];
    const bool was = units_[next]->gathered();
    launch_gather(next);
    if (!was) release(next);
  }
}

// The budget is what may wait gathered ahead of use: units the walk gathered and the
// phase has not used yet count against it (persistent ones aside), so each call tops the
// lookahead up instead of adding a budget's worth more, and the device holds the running
// unit plus the budget, as plan/MemoryModel.cpp counts it.
void ParamCoordinator::prefetch() {
  const auto& o = order();
  int64_t budget = options_.prefetch_numel;
  // Ahead: after the last unit used in the walk's order. One this rank skipped (used by
  // rank 0, not here) lies before it and stays until the phase ends without holding the
  // budget, or every later gather would wait.
  size_t ahead = cursor_;
  while (ahead > 0 && !state_[o[ahead - 1]].used) --ahead;
  for (size_t p = ahead; p < cursor_; ++p) {
    const FlatParamGroup* u = units_[o[p]];
    if (u->gathered() && u->numel() > options_.persistence_numel) budget -= u->numel();
  }
  while (cursor_ < o.size()) {
    const FlatParamGroup* next = units_[o[cursor_]];
    if (next->numel() > budget) break;
    if (live_numel() + next->numel() > options_.max_live_numel) break;
    budget -= next->numel();
    launch_gather(o[cursor_++]);
  }
}

void ParamCoordinator::release(size_t unit, bool even_persistent) {
  state_[unit].pending.wait();
  FlatParamGroup* u = units_[unit];
  if (!even_persistent && u->numel() <= options_.persistence_numel) return;
  state_[unit].held_for_use = false;
  if (secondary_ != nullptr && phase_ == Phase::Forward && u->gathered()) {
    at::NoGradGuard no_grad;
    secondary_->keep(unit, *u);
  }
  u->release_full();
}

// The first unit of backward (the last rank 0 used in forward) stays for it, on every
// rank alike; so do units touched outside their modules.
bool ParamCoordinator::kept_for_backward(size_t unit) const {
  return state_[unit].pinned || (!schedule_.backward.empty() && unit == schedule_.backward.front());
}

// Outside forward and backward a unit is there for use only where gather_now brought it
// (gathered_parameters); else (a read, a persistent unit left from the step) it goes at
// the next touch, forward or step.
ParamCoordinator::Held ParamCoordinator::held(size_t unit) const {
  if (!gathered(unit)) return Held::No;
  return phase_ != Phase::Idle || state_[unit].held_for_use ? Held::ForUse : Held::ForRead;
}

void ParamCoordinator::release_idle_touches() {
  for (size_t u : idle_touched_) release(u, /*even_persistent=*/true);
  idle_touched_.clear();
}

// Gathered in the walk's order, or again where an earlier use of this phase released it.
void ParamCoordinator::bring(size_t unit) {
  if (!state_[unit].walked) return walk_to(unit);
  if (!units_[unit]->gathered()) launch_gather(unit);  // used again after its release
  prefetch();
  wait_gathered(unit);
}

void ParamCoordinator::use_in_forward(size_t unit) {
  UnitState& s = state_[unit];
  if (!s.used) record_.first_use.push_back(unit);
  s.used = s.read = true;
  ++record_.uses[unit];
  record_.last_use[unit] = ++record_.tick;
  bring(unit);
}

void ParamCoordinator::use_in_backward(size_t unit) {
  if (phase_ != Phase::Backward) begin(Phase::Backward);
  state_[unit].used = state_[unit].read = true;
  bring(unit);
}

void ParamCoordinator::model_forward_begin() {
  if (phase_ == Phase::Backward) return;  // recomputed inside backward
  if (phase_ == Phase::Forward) finish_walk();
  begin(Phase::Forward);
}

void ParamCoordinator::model_forward_end(bool grad_enabled) {
  if (phase_ != Phase::Forward || grad_enabled) return;
  finish_walk();
  phase_ = Phase::Idle;
}

// A forward no backward follows: the rest of its walk, then everything but what an
// earlier forward's backward still needs goes.
void ParamCoordinator::finish_walk() {
  walk_rest();
  if (!schedule_.from_rank0) adopt_rank0_orders();
  for (size_t u = 0; u < units_.size(); ++u)
    if (!state_[u].pinned) release(u);
}

void ParamCoordinator::before_forward(size_t unit) {
  if (phase_ == Phase::Backward) {  // recomputed inside backward (activation checkpointing)
    use_in_backward(unit);
    return;
  }
  if (phase_ != Phase::Forward) begin(Phase::Forward);
  if (state_[unit].active++ == 0) use_in_forward(unit);
}

// After its last use in forward (rank 0's count), a unit goes, unless backward starts with it.
void ParamCoordinator::after_forward(size_t unit) {
  fault_point("forward.release");
  UnitState& s = state_[unit];
  if (phase_ != Phase::Forward || s.active == 0 || --s.active > 0) return;
  const bool used_again = record_.uses[unit] < schedule_.uses[unit];
  if (!used_again && !kept_for_backward(unit)) release(unit);
}

void ParamCoordinator::end_forward() {
  if (phase_ != Phase::Forward) begin(Phase::Forward);
  // Units this rank did not run are gathered and freed too: the other ranks may have.
  walk_rest();
  if (!schedule_.from_rank0) adopt_rank0_orders();  // this backward's order already
  for (size_t u = 0; u < units_.size(); ++u)
    if (!kept_for_backward(u)) release(u);
  begin(Phase::Backward);
}

void ParamCoordinator::before_backward(size_t unit) {
  use_in_backward(unit);
}

void ParamCoordinator::backward_done(size_t unit) {
  if (phase_ == Phase::Backward && !state_[unit].pinned) release(unit);
}

void ParamCoordinator::touch(const std::vector<int>& units, bool grad_enabled) {
  if (phase_ == Phase::Idle) {
    if (std::all_of(units.begin(), units.end(), [this](int u) { return gathered(u); })) return;
    // One unit at a time, as the reads go from one to the next.
    for (size_t u : idle_touched_)
      if (std::find(units.begin(), units.end(), static_cast<int>(u)) == units.end())
        release(u, /*even_persistent=*/true);
    idle_touched_.clear();
    for (int u : units) {
      if (!gathered(u)) gather_for_read(u);
      idle_touched_.push_back(u);
    }
    return;
  }
  // A read inside the unit's own forward, or one already kept for backward, is no new use.
  for (int u : units) {
    UnitState& s = state_[u];
    if (s.active > 0 || (s.pinned && grad_enabled)) continue;
    if (phase_ == Phase::Forward) {
      use_in_forward(u);
    } else {
      use_in_backward(u);
    }
    if (grad_enabled) s.pinned = true;
  }
}

bool ParamCoordinator::advance() {
  const auto& o = order();
  if (phase_ == Phase::Idle || cursor_ >= o.size()) return false;
  launch_gather(o[cursor_++]);
  return true;
}

void ParamCoordinator::end_backward() {
  walk_rest();
  for (auto& s : state_) s.pinned = false;
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  if (secondary_ != nullptr) secondary_->invalidate();
  phase_ = Phase::Idle;
}

void ParamCoordinator::after_step() {
  release_idle_touches();
  for (auto& s : state_) s.pinned = s.read = false;
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*even_persistent=*/true);
  if (secondary_ != nullptr) secondary_->invalidate();
  adopt_rank0_orders();
}

// Rank 0's orders as every rank's schedule, in one broadcast of 3 x units numbers:
// forward's first-use order, then every unit it did not use (registration order);
// backward's order, the reverse of the last uses with unused units first; the use counts.
void ParamCoordinator::adopt_rank0_orders() {
  const size_t n = units_.size();
  std::vector<int64_t> mine(record_.first_use.begin(), record_.first_use.end());
  for (size_t u = 0; u < n; ++u)
    if (record_.uses[u] == 0) mine.push_back(static_cast<int64_t>(u));
  std::vector<size_t> by_last(n);
  std::iota(by_last.begin(), by_last.end(), 0);
  std::stable_sort(by_last.begin(), by_last.end(), [this](size_t a, size_t b) {
    const int64_t ta = record_.last_use[a], tb = record_.last_use[b];
    return (ta == 0 ? INT64_MAX : ta) < (tb == 0 ? INT64_MAX : tb);
  });
  mine.insert(mine.end(), by_last.rbegin(), by_last.rend());
  mine.insert(mine.end(), record_.uses.begin(), record_.uses.end());
  fault_point("step.schedule");
  at::Tensor sent = at::tensor(mine, at::kLong);
  comm_->broadcast(sent, 0).wait();
  const auto* data = sent.data_ptr<int64_t>();
  schedule_.forward.assign(data, data + n);
  schedule_.backward.assign(data + n, data + 2 * n);
  schedule_.uses.assign(data + 2 * n, data + 3 * n);
  schedule_.from_rank0 = true;
}

}  // namespace zeroshard
