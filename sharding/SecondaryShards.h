#pragma once
// ZeRO++ hpZ: a second copy of stage 3's parameters, sharded inside a group of ranks (a
// node) instead of across every rank. Forward gathers each unit from every rank's primary
// shard, as stage 3 always does; when forward frees the unit, each rank keeps its part
// of the group-sharded copy, and backward gathers the unit from those parts inside the
// group, so backward's gathers never leave the node. The optimizer updates only the
// primary shards: a copy is valid from forward to the end of that backward.
//
// Ranks stay in step because every rank keeps the copies of the same units at the same
// points of the coordinator's walk (sharding/ParamCoordinator.h). The parts stay
// allocated between steps (counted as device secondary_params): refilled every forward,
// they would otherwise come and go from the heap each step.
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

class SecondaryShards {
 public:
  // `comm`: this rank's hpZ group; `units`: how many stage-3 units there are.
  SecondaryShards(Collectives* comm, size_t units, MemoryLedger* ledger);

  // `group` (unit `unit`) holds its full parameters: keep this rank's part of them.
  void keep(size_t unit, const FlatParamGroup& group);
  bool holds(size_t unit) const { return valid_.at(unit); }
  // Allocates `group`'s full buffer and fills it from the group's parts.
  CommHandle gather(size_t unit, FlatParamGroup& group);
  // The parameters change: no copy is valid until the next forward keeps it again.
  void invalidate();

 private:
  at::Tensor slice_of(const at::Tensor& flat) const;
  Collectives* comm_;
  MemoryLedger* ledger_;
  std::vector<at::Tensor> parts_;
  std::vector<LedgerEntry> entries_;
  std::vector<bool> valid_;
};

}  // namespace zeroshard
