#include "sharding/LossScaler.h"

#include <gtest/gtest.h>

using namespace zeroshard;

TEST(LossScaler, HalvesOnOverflowAfterHysteresisAndGrowsAfterWindow) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.window = 3;
  o.hysteresis = 2;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 16);
  EXPECT_TRUE(s.update(true));  // first overflow: hysteresis absorbs it
  EXPECT_EQ(s.scale(), 16);
  EXPECT_TRUE(s.update(true));  // second in a row: halve
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.update(false));  // three clean steps since the overflow: double
  EXPECT_EQ(s.scale(), 16);
}

TEST(LossScaler, StaticScaleNeverMovesAndMinIsKept) {
  LossScalerOptions fixed;
  fixed.static_scale = 128;
  LossScaler s(fixed);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 128);
  LossScalerOptions low;
  low.initial_scale_power = 1;
  low.hysteresis = 1;
  low.min_scale = 1;
  LossScaler m(low);
  m.update(true);
  m.update(true);
  EXPECT_EQ(m.scale(), 1);
}
