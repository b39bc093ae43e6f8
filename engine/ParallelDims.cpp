#include "engine/ParallelDims.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/Error.h"

namespace zeroshard {

ParallelDims::ParallelDims(int world, int rank, int dp_shard, int hpz, int tp, int pp, int ep)
    : world_(world),
      rank_(rank),
      hpz_(std::max(1, hpz)),
      tp_(std::max(1, tp)),
      pp_(std::max(1, pp)),
      ep_(std::max(1, ep)) {
  if (world_ % pp_ != 0) fail("pipeline.stages {} does not divide the {} ranks", pp_, world_);
  const int stage = world_ / pp_;
  if (stage % tp_ != 0) {
    fail("tensor_parallel.autotp_size {} does not divide the {} ranks{}", tp_, stage,
         pp_ > 1 ? " of a pipeline stage (ranks / pipeline.stages)" : "");
  }
  const int dp = stage / tp_;
  dp_shard_ = dp_shard > 0 ? dp_shard : dp;
  const char* of =
      tp_ > 1 || pp_ > 1
          ? "data-parallel ranks (ranks / (pipeline.stages * tensor_parallel.autotp_size))"
          : "ranks";
  if (dp % dp_shard_ != 0) {
    fail("zero_optimization.mics_shard_size {} does not divide the {} {}", dp_shard_, dp, of);
  }
  if (dp % hpz_ != 0) {
    fail("zero_optimization.zero_hpz_partition_size {} does not divide the {} {}", hpz_, dp, of);
  }
  if (dp % ep_ != 0) {
    fail("the mixture-of-experts layers' ep_size {} does not divide the {} {}; allowed: a divisor",
         ep_, dp, of);
  }
}

// Each dimension once: its size, this rank's coordinate in its group, which group, and the
// name's prefix. Inside a stage, tp groups are consecutive ranks, dp groups take one rank of
// each tp group; inside dp, dp_shard and hpz groups are consecutive data-parallel ranks and a
// dp_replicate group takes one of each shard group, those holding the same shard; ep and edp
// divide dp the same way. Group
// numbers count across the tp coordinates and the stages, so each name is the job's only one.
ParallelDims::Layout ParallelDims::layout(Dim d) const {
  const int stage = world_ / pp_, p = rank_ / stage, local = rank_ % stage;
  const int t = local % tp_, r = local / tp_, dp = stage / tp_;
  // A group numbered `g` among its stage's `per_stage` groups of its dimension.
  auto across = [&](int g, int size) { return p * (stage / size) + g; };
  auto inside_dp = [&](int group_of_dp, int size) { return across(group_of_dp * tp_ + t, size); };
  switch (d) {
    case Dim::Dp:
      return {dp, r, across(t, dp), "dp", "dp"};
    case Dim::DpShard:
      return {dp_shard_, r % dp_shard_, inside_dp(r / dp_shard_, dp_shard_), "dp_shard", "shard"};
    case Dim::DpReplicate: {
      const int replicas = dp / dp_shard_;
      return {replicas, r / dp_shard_, inside_dp(r % dp_shard_, replicas), "dp_replicate",
              "replica"};
    }
    case Dim::Hpz:
      return {hpz_, r % hpz_, inside_dp(r / hpz_, hpz_), "hpz", "hpz"};
    case Dim::Ep:
      return {ep_, r % ep_, inside_dp(r / ep_, ep_), "ep", "ep"};
    case Dim::Edp: {
      const int edp = dp / ep_;
      return {edp, r / ep_, inside_dp(r % ep_, edp), "edp", "edp"};
    }
    case Dim::Tp:
      return {tp_, t, across(r, tp_), "tp", "tp"};
    case Dim::Pp:
      return {pp_, p, local, "pp", "pp"};
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
