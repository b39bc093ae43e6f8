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

int ParallelDims::size(Dim d) const {
  switch (d) {
    case Dim::DpShard:
      return dp_shard_;
    case Dim::DpReplicate:
      return world_ / dp_shard_;
    case Dim::Hpz:
      return hpz_;
    case Dim::Tp:
    case Dim::Pp:
      break;
  }
  return 1;
}

int ParallelDims::coordinate(Dim d) const {
  switch (d) {
    case Dim::DpShard:
      return rank_ % dp_shard_;
    case Dim::DpReplicate:
      return rank_ / dp_shard_;
    case Dim::Hpz:
      return rank_ % hpz_;
    case Dim::Tp:
    case Dim::Pp:
      break;
  }
  return 0;
}

int ParallelDims::group_index(Dim d) const {
  switch (d) {
    case Dim::DpShard:
      return rank_ / dp_shard_;  // consecutive ranks
    case Dim::DpReplicate:
      return rank_ % dp_shard_;  // one rank of each shard group: the same shard
    case Dim::Hpz:
      return rank_ / hpz_;
    case Dim::Tp:
    case Dim::Pp:
      break;
  }
  return 0;
}

std::string ParallelDims::group_name(Dim d) const {
  const char* prefix = d == Dim::DpShard       ? "shard"
                       : d == Dim::DpReplicate ? "replica"
                       : d == Dim::Hpz         ? "hpz"
                       : d == Dim::Tp          ? "tp"
                                               : "pp";
  return fmt::format("{}{}", prefix, group_index(d));
}

const char* ParallelDims::name(Dim d) {
  switch (d) {
    case Dim::DpReplicate:
      return "dp_replicate";
    case Dim::DpShard:
      return "dp_shard";
    case Dim::Hpz:
      return "hpz";
    case Dim::Tp:
      return "tp";
    case Dim::Pp:
      break;
  }
  return "pp";
}

}  // namespace zeroshard
