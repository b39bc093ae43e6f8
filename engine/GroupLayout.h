#pragma once
// Which parameters share a flat buffer. Stages 0-2: trainable parameters in buckets of
// reduce_bucket_size elements, in registration order, frozen ones in buckets after them;
// trainable expert parameters (NamedParam::expert) in buckets of their own after the
// others', since they are reduced and sharded over another group of ranks.
// Stage 3: per unit, a sharded group of its trainable parameters and one of its frozen
// parameters (no gradients, no optimizer state), each with its experts' parameters apart;
// parameters outside every unit or tied across units (given so by a caller; engine/UnitPartition.h
// makes neither) stay whole in root groups, whose optimizer state and gradients are still sharded
// as at stage 2.
#include <cstdint>
#include <vector>

#include "common/ZeroStage.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

struct GroupSpec {
  std::vector<NamedParam> params;
  bool sharded = false;   // stage 3: only this rank's shard kept between uses
  bool trainable = true;  // has gradients and optimizer state
  int unit = -1;          // index into the units, for sharded groups
  bool expert = false;    // expert parameters: reduced and sharded over the edp ranks
};

// `units[i]` lists unit i's parameters (recursively, each once). Order of the result:
// trainable root groups (dense, then expert), unit groups in unit order (trainable, then
// frozen; dense, then expert), frozen root groups.
std::vector<GroupSpec> layout_groups(const std::vector<NamedParam>& params,
                                     const std::vector<std::vector<NamedParam>>& units,
                                     ZeroStage stage, int64_t bucket_numel);

}  // namespace zeroshard
