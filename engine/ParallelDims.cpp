#include "engine/ParallelDims.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/Error.h"

namespace zeroshard {

ParallelDims::ParallelDims(int world, int rank, int dp_shard, int hpz)
    : world_(world),
      rank_(rank),
      dp_shard_(dp_shard > 0 ? dp_shard : world),
      hpz_(std::max(1, hpz)) {
  if (world_ % dp_shard_ != 0) {
    fail("zero_optimization.mics_shard_size {} does not divide the {} ranks", dp_shard_, world_);
  }
  if (world_ % hpz_ != 0) {
    fail("zero_optimization.zero_hpz_partition_size {} does not divide the {} ranks", hpz_, world_);
  }
}

// Each dimension once: its size, this rank's coordinate in its group, which group, and the
// name's prefix. dp_shard and hpz groups are consecutive ranks; a dp_replicate group takes
// one rank of each shard group, those holding the same shard.
ParallelDims::Layout ParallelDims::layout(Dim d) const {
  switch (d) {
    case Dim::DpShard:
      return {dp_shard_, rank_ % dp_shard_, rank_ / dp_shard_, "dp_shard", "shard"};
    case Dim::DpReplicate:
      return {world_ / dp_shard_, rank_ / dp_shard_, rank_ % dp_shard_, "dp_replicate", "replica"};
    case Dim::Hpz:
      return {hpz_, rank_ % hpz_, rank_ / hpz_, "hpz", "hpz"};
    case Dim::Tp:
      return {1, 0, rank_, "tp", "tp"};
    case Dim::Pp:
      break;
  }
  return {1, 0, rank_, "pp", "pp"};
}

std::string ParallelDims::group_name(Dim d) const {
  const Layout l = layout(d);
  return fmt::format("{}{}", l.group_prefix, l.group);
}

const char* ParallelDims::name(Dim d) {
  return ParallelDims().layout(d).name;
}

}  // namespace zeroshard
