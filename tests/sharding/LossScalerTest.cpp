#include "sharding/LossScaler.h"

#include <gtest/gtest.h>

using namespace zeroshard;

// The scales DeepSpeed 0.19.8's DynamicLossScaler(init_scale=16, scale_window=3,
// delayed_shift=2, min_scale=1, consecutive_hysteresis=False) gives for the same steps.
TEST(LossScaler, HalvesAndGrowsStepForStepAsDeepSpeedDoes) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.window = 3;
  o.hysteresis = 2;
  LossScaler s(o);
  const bool overflows[] = {true, true, false, false, false, false, false, false, false};
  const double scales[] = {16, 8, 8, 8, 8, 16, 16, 16, 32};
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(s.update(overflows[i]), overflows[i]);
    EXPECT_EQ(s.scale(), scales[i]) << "step " << i;
  }
  EXPECT_EQ(s.state().hysteresis_left, 2);  // restored when the scale grew
  EXPECT_EQ(s.state().last_overflow, 1);
  EXPECT_EQ(s.state().iteration, 9);
  LossScaler clean(o);  // from the start: the fourth clean step doubles, then every third
  const double grows[] = {16, 16, 16, 32, 32, 32, 64, 64};
  for (size_t i = 0; i < 8; ++i) {
    clean.update(false);
    EXPECT_EQ(clean.scale(), grows[i]) << "step " << i;
  }
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
