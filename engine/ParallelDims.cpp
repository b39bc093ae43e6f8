#include "engine/ParallelDims.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/Error.h"

namespace zeroshard {

ParallelDims::ParallelDims(int world, int rank, int dp_shard, int hpz, int tp)
    : world_(world), rank_(rank), hpz_(std::max(1, hpz)), tp_(std::max(1, tp)) {
  if (world_ % tp_ != 0) {
    fail("tensor_parallel.autotp_size {} does not divide the {} ranks", tp_, world_);
  }
  const int dp = world_ / tp_;
  dp_shard_ = dp_shard > 0 ? dp_shard : dp;
  const char* of = tp_ > 1 ? "data-parallel ranks (ranks / tensor_parallel.autotp_size)" : "ranks";
  if (dp % dp_shard_ != 0) {
    fail("zero_optimization.mics_shard_size {} does not divide the {} {}", dp_shard_, dp, of);
  }
  if (dp % hpz_ != 0) {
    fail("zero_optimization.zero_hpz_partition_size {} does not divide the {} {}", hpz_, dp, of);
  }
}

// Each dimension once: its size, this rank's coordinate in its group, which group, and the
// name's prefix. tp groups are consecutive ranks, dp groups take one rank of each tp group.
// Inside dp, dp_shard and hpz groups are consecutive data-parallel ranks and a dp_replicate
// group takes one of each shard group, those holding the same shard; their group numbers
// count across the tp coordinates, so each name is the job's only one.
ParallelDims::Layout ParallelDims::layout(Dim d) const {
  const int t = rank_ % tp_, r = rank_ / tp_, dp = world_ / tp_;
  auto inside_dp = [&](int group_of_dp) { return group_of_dp * tp_ + t; };
  switch (d) {
    case Dim::Dp:
      return {dp, r, t, "dp", "dp"};
    case Dim::DpShard:
      return {dp_shard_, r % dp_shard_, inside_dp(r / dp_shard_), "dp_shard", "shard"};
    case Dim::DpReplicate:
      return {dp / dp_shard_, r / dp_shard_, inside_dp(r % dp_shard_), "dp_replicate", "replica"};
    case Dim::Hpz:
      return {hpz_, r % hpz_, inside_dp(r / hpz_), "hpz", "hpz"};
    case Dim::Tp:
      return {tp_, t, r, "tp", "tp"};
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
