#pragma once
// The named dimensions of this job's ranks, as torchtitan's ParallelDims and a DeviceMesh's
// dimension names describe them: each dimension's size, this rank's coordinate along it,
// the ranks that share its other coordinates (its group) and that group's name. Built once
// from the launch environment and the resolved settings; the process groups
// (engine/ProcessGroupSetup.h) are made and asked for by dimension.
//
//   tp            ranks that split each tensor-parallel parameter (tensor_parallel.autotp_size,
//                 or a Megatron mpu), 1 without; consecutive ranks, as Megatron lays them out
//                 and as a DeviceMesh ("dp", "tp") numbers them;
//   dp            the data-parallel ranks: those with this rank's tp coordinate, world / tp of
//                 them. ZeRO works over them alone: the engine's broadcasts, reductions,
//                 gathers and checkpoints never cross a tp group. Without tp, the world;
//   dp_replicate  ranks holding the same shard in different shard groups: MiCS's
//                 replicas (mics_shard_size), 1 without;
//   dp_shard      ranks whose shards make up one copy of the model state: the shard
//                 group (mics_shard_size), else every data-parallel rank;
//   hpz           ranks sharing stage 3's secondary copy of the parameters, which
//                 backward gathers from (ZeRO++ hpZ, zero_hpz_partition_size), 1 without.
//                 It divides the data-parallel ranks like dp_shard, not inside it.
//   ep            ranks that split a mixture-of-experts layer's experts between them (DeepSpeed's
//                 ep_size), 1 without: consecutive data-parallel ranks, as DeepSpeed's
//                 expert-parallel groups are;
//   edp           ranks holding the same experts, one of each ep group (DeepSpeed's expert-
//                 data-parallel group): the experts' gradients are reduced and their state
//                 sharded over it, dp / ep ranks. Like dp_replicate, across ep groups.
//   pp            pipeline stages (pipeline.stages), the outermost dimension as torchtitan's
//                 mesh and DeepSpeed's topology lay it out: each stage is world / pp
//                 consecutive ranks, and every dimension above lives inside one stage. A pp
//                 group holds one rank of each stage, those with the same place in theirs.
// rank = pp coordinate * (world / pp) + dp coordinate * tp + tp coordinate, and inside dp,
// dp_shard fastest: dp coordinate = replica * dp_shard + shard index, and likewise
// dp coordinate = edp coordinate * ep + ep coordinate.
#include <string>
#include <vector>

namespace zeroshard {

enum class Dim { Dp, DpReplicate, DpShard, Hpz, Ep, Edp, Tp, Pp };

class ParallelDims {
 public:
  ParallelDims() = default;
  // `dp_shard`: ranks per shard group (<= 0: every data-parallel rank); `hpz`: ranks per
  // hpZ group (<= 1: none); `tp`: ranks per tensor-parallel group; `pp`: pipeline stages;
  // `ep`: ranks per expert-parallel group. pp must divide `world`, tp world / pp, the others
  // world / (pp * tp); the error names the config key.
  ParallelDims(int world, int rank, int dp_shard, int hpz, int tp = 1, int pp = 1, int ep = 1);

  int world() const { return world_; }
  int rank() const { return rank_; }
  int size(Dim d) const { return layout(d).size; }
  // This rank's index inside its group of dimension d.
  int coordinate(Dim d) const { return layout(d).coordinate; }
  // The dimension has a group of more than one rank, smaller than the world: one that
  // needs a process group of its own (a group of every rank is the world's).
  bool splits(Dim d) const { return size(d) > 1 && size(d) < world_; }
  // Ranks of one pipeline stage, and this rank's place among them.
  int stage_ranks() const { return world_ / pp_; }
  int rank_in_stage() const { return rank_ % stage_ranks(); }
  // Which of the dimension's groups this rank is in (0 .. world / size - 1).
  int group_index(Dim d) const { return layout(d).group; }
  // The group's name, the same on every rank of it: "shard1", "replica0", "hpz0", "dp1".
  std::string group_name(Dim d) const;
  static const char* name(Dim d);  // "dp_shard", ...

 private:
  struct Layout {
    int size, coordinate, group;
    const char* name;          // the dimension's
    const char* group_prefix;  // its groups' names: prefix and group index
  };
  Layout layout(Dim d) const;

  int world_ = 1;
  int rank_ = 0;
  int dp_shard_ = 1;
  int hpz_ = 1;
  int tp_ = 1;
  int pp_ = 1;
  int ep_ = 1;
};

}  // namespace zeroshard
