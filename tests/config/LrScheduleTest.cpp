#include "config/LrSchedule.h"

#include <cmath>

#include <gtest/gtest.h>

using namespace zeroshard;

TEST(LrSchedule, ConstantWithoutScheduler) {
  Config c;
  c.optimizer.lr = 0.25;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 999), 0.25);
}

TEST(LrSchedule, WarmupShapes) {
  Config c;
  c.scheduler.type = "WarmupDecayLR";
  c.scheduler.warmup_min_lr = 0.0;
  c.scheduler.warmup_max_lr = 1.0;
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.total_num_steps = 110;
  c.scheduler.warmup_type = "linear";
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 60), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 200), 0.0);
  c.scheduler.warmup_type = "log";  // DeepSpeed: log(t + 1) / log(warmup)
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), std::log(5.0) / std::log(10.0));
  c.scheduler.type = "WarmupCosineLR";
  c.scheduler.warmup_min_lr = 0.1;
  EXPECT_NEAR(learning_rate(c, 60), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(c, 110), 0.1, 1e-12);
  c.scheduler.type = "WarmupLR";
  EXPECT_DOUBLE_EQ(learning_rate(c, 500), 1.0);
}
