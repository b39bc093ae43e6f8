#pragma once
// Stage 3: decides when each unit's full parameters exist. Before a unit runs (forward,
// or backward through it) its parameters are gathered; afterwards they are freed.
//
// Ranks stay in step because every forward (and every backward, in reverse) walks a
// schedule holding *every* unit, in an order all ranks agree on: the order rank 0 saw
// units first used in the previous step (registration order in the first step). A
// unit a rank does not use this step (a data-dependent branch) is still gathered and
// freed when the walk passes it, so every rank issues the same all-gathers in the same
// order. Prefetch runs ahead along the schedule, bounded by the prefetch budget and the
// live-parameter limit; units at or below the persistence threshold are never freed.
// With hpZ (sharding/SecondaryShards.h) forward's frees keep the group-sharded copy that
// backward's gathers read.
#include <cstdint>
#include <vector>

#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"
#include "sharding/SecondaryShards.h"

namespace zeroshard {

// Stage-3 parameter offload: where a unit's shard lives between uses. The coordinator
// calls prefetch() for units coming up in its walk and fill() right before a gather.
class ShardHome {
 public:
  virtual ~ShardHome() = default;
  // Whether `unit`'s shard lives here (else the group keeps it itself).
  virtual bool holds(size_t unit) const = 0;
  virtual void prefetch(size_t unit) = 0;                       // start bringing it back
  virtual void fill(size_t unit, const at::Tensor& slice) = 0;  // wait; copy into slice
};

struct CoordinatorOptions {
  int64_t prefetch_numel = 0;     // stage3_prefetch_bucket_size
  int64_t max_live_numel = 0;     // stage3_max_live_parameters
  int64_t persistence_numel = 0;  // stage3_param_persistence_threshold
};

class ParamCoordinator {
 public:
  ParamCoordinator(std::vector<FlatParamGroup*> units, Collectives* comm,
                   const CoordinatorOptions& options);

  void before_forward(size_t unit);
  void after_forward(size_t unit);
  void end_forward();
  void before_backward(size_t unit);
  void backward_done(size_t unit);
  void end_backward();
  // Issue the next gather of the current walk ahead of need; false when none is left.
  bool advance();
  // After each optimizer step: every full copy is stale (persistent ones included), and
  // the schedule becomes rank 0's recorded order (one small broadcast).
  void after_step();

  int64_t live_numel() const;  // parameters currently gathered (budgets count parameters)
  // `lookahead`: how many units past the last gather issued are prefetched from home.
  void set_shard_home(ShardHome* home, int lookahead);
  // hpZ: keep secondary copies when forward frees units, gather from them in backward.
  void set_secondary(SecondaryShards* secondary) { secondary_ = secondary; }
  // Outside forward/backward (reading parameters): gather one unit now / free it.
  void gather_now(size_t unit);
  bool gathered(size_t unit) const { return units_.at(unit)->gathered(); }
  void release_now(size_t unit);

 private:
  enum class Phase { Idle, Forward, Backward };
  void begin(Phase phase);
  void walk_to(size_t unit);
  void prefetch();
  void launch_gather(size_t unit);
  void wait_gathered(size_t unit);
  void release(size_t unit, bool even_persistent = false);
  size_t position_of(size_t unit) const;
  const std::vector<size_t>& order() const;

  std::vector<FlatParamGroup*> units_;
  Collectives* comm_;
  CoordinatorOptions options_;
  std::vector<size_t> schedule_;     // forward order; backward walks it reversed
  std::vector<size_t> backward_;     // schedule_ reversed
  std::vector<size_t> recorded_;     // this step's first-use order on this rank
  std::vector<bool> used_;           // used in the current phase
  std::vector<CommHandle> pending_;  // per unit: gather in flight
  std::vector<bool> walked_;         // gather issued in the current phase
  size_t cursor_ = 0;                // next position of the walk
  Phase phase_ = Phase::Idle;
  ShardHome* home_ = nullptr;
  int lookahead_ = 0;
  SecondaryShards* secondary_ = nullptr;
};

}  // namespace zeroshard
