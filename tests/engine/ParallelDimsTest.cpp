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
