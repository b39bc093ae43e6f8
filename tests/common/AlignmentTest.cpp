#include "common/Alignment.h"

#include <gtest/gtest.h>

using namespace zeroshard;

TEST(Alignment, PaddedShardsCoverTheBufferAndAreAligned) {
  for (int64_t numel : {1, 63, 64, 1000, 124'439'808}) {
    for (int64_t ranks : {1, 2, 3, 8}) {
      const int64_t shard = padded_shard_numel(numel, ranks);
      EXPECT_EQ(shard % kShardAlignElements, 0);
      EXPECT_GE(shard * ranks, numel);
      EXPECT_LT(shard * ranks - numel, ranks * kShardAlignElements + ranks);
    }
  }
  EXPECT_EQ(padded_shard_numel(1000, 4), 256);  // 250 rounded up to 64s
  EXPECT_EQ(round_up(5, 4), 8);
  EXPECT_EQ(ceil_div(9, 3), 3);
}
