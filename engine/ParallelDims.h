#pragma once
// The named dimensions of this job's ranks, as torchtitan's ParallelDims and a DeviceMesh's
// dimension names describe them: each dimension's size, this rank's coordinate along it,
// the ranks that share its other coordinates (its group) and that group's name. Built once
// from the launch environment and the resolved settings; the process groups
// (engine/ProcessGroupSetup.h) are made and asked for by dimension.
//
//   dp_replicate  ranks holding the same shard in different shard groups: MiCS's
//                 replicas (mics_shard_size), 1 without;
//   dp_shard      ranks whose shards make up one copy of the model state: the shard
//                 group (mics_shard_size), else every rank;
//   hpz           ranks sharing stage 3's secondary copy of the parameters, which
//                 backward gathers from (ZeRO++ hpZ, zero_hpz_partition_size), 1 without.
//                 It divides the world like dp_shard, not inside it.
// The ranks are laid out with dp_shard fastest: rank = replica * dp_shard + shard index.
// Tensor and pipeline dimensions (tp, pp) are not built yet: their size is 1.
#include <string>
#include <vector>

namespace zeroshard {

enum class Dim { DpReplicate, DpShard, Hpz, Tp, Pp };

class ParallelDims {
 public:
  ParallelDims() = default;
  // `dp_shard`: ranks per shard group (<= 0: every rank); `hpz`: ranks per hpZ group
  // (<= 1: none). Each must divide `world`; the error names the config key.
  ParallelDims(int world, int rank, int dp_shard, int hpz);

  int world() const { return world_; }
  int rank() const { return rank_; }
  int size(Dim d) const { return layout(d).size; }
  // This rank's index inside its group of dimension d.
  int coordinate(Dim d) const { return layout(d).coordinate; }
  // The dimension has a group of more than one rank, smaller than the world: one that
  // needs a process group of its own (a group of every rank is the world's).
  bool splits(Dim d) const { return size(d) > 1 && size(d) < world_; }
  // Which of the dimension's groups this rank is in (0 .. world / size - 1).
  int group_index(Dim d) const { return layout(d).group; }
  // The group's name, the same on every rank of it: "shard1", "replica0", "hpz0".
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
};

}  // namespace zeroshard
