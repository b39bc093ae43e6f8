#pragma once
// Stage 3: decides when each unit's full parameters exist. Before a unit runs (forward,
// or backward through it) its parameters are gathered; afterwards they are freed.
//
// Ranks stay in step because every forward (and every backward) walks a schedule holding
// *every* unit, in an order all ranks agree on: the order rank 0 first used units in
// forward, and for backward the reverse of the order it last used them (a head tied to
// the embedding comes first in backward though the embedding came first in forward). A
// unit a rank does not use this step (a data-dependent branch, a vision tower a
// text-only batch skips) is still gathered when the walk passes it, and freed at once,
// so every rank issues the same all-gathers in the same order. Rank 0's orders are sent
// to every rank after each optimizer step, and once at the end of the first forward
// (before it, forward walks the registration order). A rank that uses a unit after the
// walk passed it gathers it alone: ranks may skip units, not reorder them.
//
// A unit rank 0 used several times in a forward (a module reused, an embedding and the
// head tied to it) stays gathered from its first use to its last, so no rank gathers it
// twice. Prefetch runs ahead along the schedule, keeping at most the prefetch budget
// gathered and not yet used, within the live-parameter limit; units at or below the persistence
// threshold are never freed inside a step. A unit whose parameters are read outside its own modules
// (touch()) stays until backward ends. With hpZ (sharding/SecondaryShards.h) forward's frees keep
// the group-sharded copy that backward's gathers read.
#include <cstdint>
#include <memory>
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
  // `comm` carries the walk's gathers; `touch_comm` the gathers outside forward and
  // backward (gather_now, touch), which no schedule orders: on a group of their own, a
  // rank that makes one alone waits there until the timeout instead of pairing with the
  // others' walk.
  ParamCoordinator(std::vector<FlatParamGroup*> units, Collectives* comm, Collectives* touch_comm,
                   const CoordinatorOptions& options);
  // Units sharded over other ranks than `comm`'s (expert parallelism: the experts' groups
  // over the ranks holding the same experts): per unit, the group its walk's gathers and
  // its reads' gathers go over, null for `comm` and `touch_comm`. Every rank still walks
  // one order (rank 0's, agreed over `comm`), so each group sees its gathers in that order.
  void set_unit_groups(std::vector<Collectives*> gathers, std::vector<Collectives*> touches) {
    others_ = {std::move(gathers), std::move(touches)};
  }

  // The model's forward begins / ends (its root module's hooks, where there are such). A
  // forward that no backward followed (evaluation, generation, a second forward before
  // one backward) ends its walk when the next begins; one without gradients, at its end.
  void model_forward_begin();
  void model_forward_end(bool grad_enabled);
  // A unit's forward begins / ends; nested calls for one unit count as one.
  void before_forward(size_t unit);
  void after_forward(size_t unit);
  void end_forward();
  void before_backward(size_t unit);
  void backward_done(size_t unit);
  void end_backward();
  // A parameter of `units` (the groups of one module's unit) is read. Inside the units'
  // own forward that is nothing new. Elsewhere in forward or backward each is a use in the
  // walk (gathered where it is not there) and, where autograd records the read
  // (`grad_enabled`), kept until backward ends: what autograd saved of it is read again
  // there. Outside forward and backward (code reading parameters between steps) they are
  // gathered now, where they are not there, over the touch group (a collective every rank
  // makes alike), and the units touched before them are released.
  void touch(const std::vector<int>& units, bool grad_enabled);
  // Issue the next gather of the current walk ahead of need; false when none is left.
  bool advance();
  // After each optimizer step: every full copy is stale (persistent ones included), and
  // the schedule becomes rank 0's recorded orders (one small broadcast).
  void after_step();

  int64_t live_numel() const;  // parameters currently gathered (budgets count parameters)
  // Units of at most `numel` parameters are kept from their first use in a step to the
  // step (stage3_param_persistence_threshold; a pipeline stage keeps every unit so).
  void set_persistence_numel(int64_t numel) { options_.persistence_numel = numel; }
  // `lookahead`: how many units past the last gather issued are prefetched from home.
  void set_shard_home(ShardHome* home, int lookahead);
  // hpZ: keep secondary copies when forward frees units, gather from them in backward.
  void set_secondary(std::unique_ptr<SecondaryShards> secondary) {
    secondary_ = std::move(secondary);
  }
  // Outside forward/backward (gathered_parameters, full_parameters): gather one unit now,
  // held for use (written, aliased) until release_now / free it.
  void gather_now(size_t unit);
  bool gathered(size_t unit) const { return units_.at(unit)->gathered(); }
  // Whether `unit`'s full parameters are there, and for what. Outside forward and backward
  // a unit not brought by gather_now is there for a read only, until the next touch,
  // forward or step: what reads it must copy what it keeps, and nothing may write it.
  enum class Held { No, ForUse, ForRead };
  Held held(size_t unit) const;
  // Whether `unit` was gathered for a use since the last optimizer step: a gradient of a
  // unit that was not came from a read of the placeholder a released parameter holds.
  bool read_this_step(size_t unit) const { return state_.at(unit).read; }
  bool in_backward() const { return phase_ == Phase::Backward; }
  void release_now(size_t unit);

 private:
  enum class Phase { Idle, Forward, Backward };
  void begin(Phase phase);
  void finish_walk();
  void use_in_forward(size_t unit);
  void use_in_backward(size_t unit);
  void bring(size_t unit);
  void walk_to(size_t unit);
  void walk_rest();
  void gather_for_read(size_t unit);
  void prefetch();
  void launch_gather(size_t unit, Collectives* comm = nullptr);
  void wait_gathered(size_t unit);
  void release(size_t unit, bool even_persistent = false);
  bool kept_for_backward(size_t unit) const;
  void release_idle_touches();
  void adopt_rank0_orders();
  size_t position_of(size_t unit) const;
  const std::vector<size_t>& order() const;

  // The schedule every rank walks (rank 0's; written by adopt_rank0_orders).
  struct Schedule {
    std::vector<size_t> forward;   // first-use order
    std::vector<size_t> backward;  // the reverse of the last-use order
    std::vector<int64_t> uses;     // per unit: uses in one forward
    bool from_rank0 = false;       // false until the first forward's end
  };
  // What this rank's current forward did (written by use_in_forward, sent by rank 0).
  struct ForwardRecord {
    std::vector<size_t> first_use;
    std::vector<int64_t> uses;
    std::vector<int64_t> last_use;  // per unit: the tick of its last use, 0: none
    int64_t tick = 0;
  };
  // Per unit, in the current phase.
  struct UnitState {
    CommHandle pending;   // gather in flight
    bool walked = false;  // gather issued by the walk
    bool used = false;
    int active = 0;             // forwards begun and not ended
    bool pinned = false;        // touched inside forward or backward: kept to backward's end
    bool read = false;          // gathered for a use since the last step (not only walked)
    bool held_for_use = false;  // by gather_now, until released
  };

  std::vector<FlatParamGroup*> units_;
  Collectives* comm_;
  Collectives* touch_comm_;
  struct OwnGroups {  // per unit (empty: none): its gathers' own groups, or null
    std::vector<Collectives*> gathers, touches;
  } others_;
  CoordinatorOptions options_;
  Schedule schedule_;
  ForwardRecord record_;
  std::vector<UnitState> state_;
  std::vector<size_t> idle_touched_;
  size_t cursor_ = 0;  // next position of the walk
  Phase phase_ = Phase::Idle;
  struct Home {  // set_shard_home's
    ShardHome* shards = nullptr;
    int lookahead = 0;
  };
  Home home_;
  std::unique_ptr<SecondaryShards> secondary_;
};

}  // namespace zeroshard
