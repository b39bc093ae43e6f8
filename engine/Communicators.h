#pragma once
// The engine's collectives, one per job a process group does (engine/ProcessGroupSetup.h
// makes the groups). Each stream of collectives that ranks may issue in different
// interleavings has a group of its own, so that every group sees one fixed order on every
// rank (docs/architecture.md "Rules that keep ranks in step"):
//   data_parallel  the data-parallel ranks (engine/ParallelDims.h; every rank without tensor
//             parallelism): broadcasts (initial values, buffers), barriers, checkpoints;
//   shards    reductions and gathers of shards: the shard group (mics_shard_size), or
//             data_parallel;
//   params    stage-3 gathers in the schedule's order, inside the shard group;
//   touches   stage-3 gathers outside any schedule (reads between steps), inside it too;
//   replicas  the ranks holding this shard in the other shard groups (null without groups);
//   hpz       backward's gathers of hpZ's secondary copy inside the node (null without hpZ);
//   tensor_parallel  the ranks splitting each tensor-parallel parameter with this one: the
//             gradient norm and the overflow check are summed across them (null without);
//   pipeline_parallel  the ranks with this rank's place in the other pipeline stages: the
//             norm and the overflow check are summed across them too (null without);
//   experts   the ranks holding this rank's experts (edp): reductions, gathers and
//             broadcasts of expert parameters' groups (null without expert parallelism);
//             with its own params and touches streams for stage 3's gathers of them.
#include <cstdint>
#include <memory>

#include "common/MemoryLedger.h"
#include "engine/ProcessGroupSetup.h"
#include "sharding/Collectives.h"

namespace zeroshard {

class Communicators {
 public:
  // `dist` outlives this object: a failed collective asks it which ranks are gone.
  // `check`: every collective's fingerprint is agreed on first (sharding/Collectives.h).
  Communicators(const DistContext& dist, MemoryLedger* ledger, bool check = false);

  Collectives& data_parallel() { return *data_parallel_; }
  Collectives& shards() { return group_ ? *group_ : *data_parallel_; }
  Collectives& params() { return *params_; }
  Collectives& touches() { return *touches_; }
  Collectives* replicas() { return replicas_.get(); }
  // Where backward gathers a stage-3 unit: hpZ's group, else the params group.
  Collectives& backward_gathers() { return hpz_ ? *hpz_ : *params_; }
  Collectives* tensor_parallel() { return tensor_parallel_.get(); }
  Collectives* pipeline_parallel() { return pipeline_parallel_.get(); }
  // Where a group's shards are reduced and gathered: the experts' group for a group of
  // expert parameters, else shards().
  Collectives& shards(bool expert) { return expert && experts_ ? *experts_ : shards(); }
  Collectives* experts() { return experts_.get(); }
  // Where a parameter's values are broadcast from (initial values, a modifier's writes):
  // the experts' group for an expert parameter, else data_parallel().
  Collectives& broadcasts(bool expert) { return expert && experts_ ? *experts_ : *data_parallel_; }
  // Stage 3's gathers of a group: an expert group's over the experts' ranks.
  Collectives& params(bool expert) { return expert && experts_ ? *expert_params_ : *params_; }
  Collectives& touches(bool expert) { return expert && experts_ ? *expert_touches_ : *touches_; }
  // Bytes this rank has sent over every group (ring-algorithm volume).
  int64_t bytes_sent() const;

 private:
  std::unique_ptr<CollectiveWatch> watch_;  // before the groups: they report to it
  std::unique_ptr<Collectives> data_parallel_;
  std::unique_ptr<Collectives> group_;  // the shard group, with mics_shard_size
  std::unique_ptr<Collectives> params_;
  std::unique_ptr<Collectives> touches_;
  std::unique_ptr<Collectives> replicas_;
  std::unique_ptr<Collectives> hpz_;
  std::unique_ptr<Collectives> tensor_parallel_;
  std::unique_ptr<Collectives> pipeline_parallel_;
  std::unique_ptr<Collectives> experts_;
  std::unique_ptr<Collectives> expert_params_;
  std::unique_ptr<Collectives> expert_touches_;
};

}  // namespace zeroshard
