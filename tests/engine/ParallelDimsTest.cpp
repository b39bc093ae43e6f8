// engine/ParallelDims: each named dimension's size, every rank's coordinates and group, and
// the groups' names, against a layout written out by hand; sizes that do not divide the
// world are refused naming the config key.
#include "engine/ParallelDims.h"

#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

// 8 ranks in shard groups of 4 (MiCS): {0,1,2,3} and {4,5,6,7}; replicas hold the same
// shard: {0,4}, {1,5}, {2,6}, {3,7}; hpZ groups of 2: {0,1}, {2,3}, ...
TEST(ParallelDims, EveryRankFindsItsGroupsAsTheLayoutSays) {
  std::map<std::string, std::set<int>> members;
  for (int rank = 0; rank < 8; ++rank) {
    const ParallelDims d(8, rank, 4, 2);
    EXPECT_EQ(d.size(Dim::DpShard), 4);
    EXPECT_EQ(d.size(Dim::DpReplicate), 2);
    EXPECT_EQ(d.size(Dim::Hpz), 2);
    EXPECT_EQ(d.size(Dim::Tp), 1);
    EXPECT_EQ(d.size(Dim::Pp), 1);
    EXPECT_EQ(d.coordinate(Dim::DpShard), rank % 4);
    EXPECT_EQ(d.coordinate(Dim::DpReplicate), rank / 4);
    EXPECT_EQ(d.coordinate(Dim::Hpz), rank % 2);
    for (Dim dim : {Dim::DpShard, Dim::DpReplicate, Dim::Hpz})
      members[d.group_name(dim)].insert(rank);
  }
  const std::map<std::string, std::set<int>> want = {
      {"shard0", {0, 1, 2, 3}}, {"shard1", {4, 5, 6, 7}}, {"replica0", {0, 4}},
      {"replica1", {1, 5}},     {"replica2", {2, 6}},     {"replica3", {3, 7}},
      {"hpz0", {0, 1}},         {"hpz1", {2, 3}},         {"hpz2", {4, 5}},
      {"hpz3", {6, 7}}};
  EXPECT_EQ(members, want);
}

// Without MiCS or hpZ: one shard group of every rank, which needs no group of its own.
TEST(ParallelDims, WithoutGroupsTheShardDimensionIsTheWorld) {
  const ParallelDims d(4, 3, -1, 1);
  EXPECT_EQ(d.size(Dim::DpShard), 4);
  EXPECT_EQ(d.coordinate(Dim::DpShard), 3);
  EXPECT_EQ(d.size(Dim::DpReplicate), 1);
  EXPECT_FALSE(d.splits(Dim::DpShard));
  EXPECT_FALSE(d.splits(Dim::Hpz));
  EXPECT_TRUE(ParallelDims(4, 0, 2, 1).splits(Dim::DpShard));
  EXPECT_STREQ(ParallelDims::name(Dim::DpReplicate), "dp_replicate");
}

TEST(ParallelDims, ASizeThatDoesNotDivideTheWorldNamesItsKey) {
  try {
    ParallelDims(6, 0, 4, 1);
    FAIL() << "4 shards of 6 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.mics_shard_size 4 does not divide "
                                         "the 6 ranks"),
              std::string::npos)
        << e.what();
  }
  try {
    ParallelDims(6, 0, 3, 4);
    FAIL() << "hpZ groups of 4 among 6 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.zero_hpz_partition_size 4 does not "
                                         "divide the 6 ranks"),
              std::string::npos)
        << e.what();
  }
}

// 8 ranks at tp 2 (Megatron's order: tp groups {0,1}, {2,3}, ...), so 4 data-parallel
// ranks per tp coordinate: dp0 = {0,2,4,6}, dp1 = {1,3,5,7}; MiCS groups of 2 inside
// each: shards {0,2}, {1,3}, {4,6}, {5,7}; replicas {0,4}, {1,5}, {2,6}, {3,7}.
TEST(ParallelDims, TensorParallelRanksAreConsecutiveAndZeroWorksAcrossTheOthers) {
  std::map<std::string, std::set<int>> members;
  for (int rank = 0; rank < 8; ++rank) {
    const ParallelDims d(8, rank, 2, 1, 2);
    EXPECT_EQ(d.size(Dim::Tp), 2);
    EXPECT_EQ(d.coordinate(Dim::Tp), rank % 2);
    EXPECT_EQ(d.size(Dim::Dp), 4);
    EXPECT_EQ(d.coordinate(Dim::Dp), rank / 2);
    EXPECT_EQ(d.coordinate(Dim::DpShard), (rank / 2) % 2);
    EXPECT_TRUE(d.splits(Dim::Dp));
    for (Dim dim : {Dim::Tp, Dim::Dp, Dim::DpShard, Dim::DpReplicate})
      members[d.group_name(dim)].insert(rank);
  }
  const std::map<std::string, std::set<int>> want = {
      {"tp0", {0, 1}},       {"tp1", {2, 3}},       {"tp2", {4, 5}},      {"tp3", {6, 7}},
      {"dp0", {0, 2, 4, 6}}, {"dp1", {1, 3, 5, 7}}, {"shard0", {0, 2}},   {"shard1", {1, 3}},
      {"shard2", {4, 6}},    {"shard3", {5, 7}},    {"replica0", {0, 4}}, {"replica1", {1, 5}},
      {"replica2", {2, 6}},  {"replica3", {3, 7}}};
  EXPECT_EQ(members, want);
  // Without MiCS the shard group is the whole data-parallel group.
  EXPECT_EQ(ParallelDims(4, 3, -1, 1, 2).size(Dim::DpShard), 2);
  try {
    ParallelDims(6, 0, -1, 1, 4);
    FAIL() << "tp 4 of 6 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor_parallel.autotp_size 4 does not divide the 6"),
              std::string::npos)
        << e.what();
  }
}

// 8 ranks as pp 2 x dp 2 x tp 2 (torchtitan's mesh order, pipe outermost as in DeepSpeed's
// topology): stage 0 is ranks 0-3, stage 1 ranks 4-7; inside each, tp groups are
// consecutive and dp groups take one rank of each; a pp group holds the ranks with the same
// place in each stage: {0,4}, {1,5}, {2,6}, {3,7}.
TEST(ParallelDims, PipelineStagesAreTheOutermostDimension) {
  std::map<std::string, std::set<int>> members;
  for (int rank = 0; rank < 8; ++rank) {
    const ParallelDims d(8, rank, -1, 1, 2, 2);
    EXPECT_EQ(d.size(Dim::Pp), 2);
    EXPECT_EQ(d.coordinate(Dim::Pp), rank / 4);
    EXPECT_EQ(d.stage_ranks(), 4);
    EXPECT_EQ(d.rank_in_stage(), rank % 4);
    EXPECT_EQ(d.size(Dim::Dp), 2);
    EXPECT_EQ(d.coordinate(Dim::Dp), (rank % 4) / 2);
    EXPECT_EQ(d.coordinate(Dim::Tp), rank % 2);
    EXPECT_TRUE(d.splits(Dim::Dp));
    EXPECT_TRUE(d.splits(Dim::Pp));
    for (Dim dim : {Dim::Pp, Dim::Tp, Dim::Dp}) members[d.group_name(dim)].insert(rank);
  }
  const std::map<std::string, std::set<int>> want = {
      {"pp0", {0, 4}}, {"pp1", {1, 5}}, {"pp2", {2, 6}}, {"pp3", {3, 7}},
      {"tp0", {0, 1}}, {"tp1", {2, 3}}, {"tp2", {4, 5}}, {"tp3", {6, 7}},
      {"dp0", {0, 2}}, {"dp1", {1, 3}}, {"dp2", {4, 6}}, {"dp3", {5, 7}}};
  EXPECT_EQ(members, want);
  // MiCS inside a stage: shard groups never cross stages.
  std::map<std::string, std::set<int>> shards;
  for (int rank = 0; rank < 8; ++rank)
    shards[ParallelDims(8, rank, 2, 1, 1, 2).group_name(Dim::DpShard)].insert(rank);
  const std::map<std::string, std::set<int>> want_shards = {
      {"shard0", {0, 1}}, {"shard1", {2, 3}}, {"shard2", {4, 5}}, {"shard3", {6, 7}}};
  EXPECT_EQ(shards, want_shards);
  try {
    ParallelDims(6, 0, -1, 1, 1, 4);
    FAIL() << "4 stages of 6 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.stages 4 does not divide the 6 ranks"),
              std::string::npos)
        << e.what();
  }
}

// 8 ranks at ep 2, DeepSpeed's layout (_create_expert_and_data_parallel): expert-parallel
// groups of consecutive ranks {0,1}, {2,3}, ...; expert-data-parallel groups hold one rank
// of each, those with the same experts: {0,2,4,6} and {1,3,5,7}.
TEST(ParallelDims, ExpertParallelRanksAreConsecutiveAndTheirDataParallelGroupsAcross) {
  std::map<std::string, std::set<int>> members;
  for (int rank = 0; rank < 8; ++rank) {
    const ParallelDims d(8, rank, -1, 1, 1, 1, 2);
    EXPECT_EQ(d.size(Dim::Ep), 2);
    EXPECT_EQ(d.size(Dim::Edp), 4);
    EXPECT_EQ(d.coordinate(Dim::Ep), rank % 2);
    EXPECT_EQ(d.coordinate(Dim::Edp), rank / 2);
    EXPECT_EQ(d.size(Dim::DpShard), 8);  // dense parameters still shard over every rank
    for (Dim dim : {Dim::Ep, Dim::Edp}) members[d.group_name(dim)].insert(rank);
  }
  const std::map<std::string, std::set<int>> want = {
      {"ep0", {0, 1}}, {"ep1", {2, 3}},        {"ep2", {4, 5}},
      {"ep3", {6, 7}}, {"edp0", {0, 2, 4, 6}}, {"edp1", {1, 3, 5, 7}}};
  EXPECT_EQ(members, want);
  EXPECT_EQ(ParallelDims(4, 1, -1, 1).size(Dim::Edp), 4);  // without ep: every rank
  try {
    ParallelDims(6, 0, -1, 1, 1, 1, 4);
    FAIL() << "ep 4 of 6 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ep_size 4 does not divide the 6 ranks"),
              std::string::npos)
        << e.what();
  }
}
