// The schedules' arithmetic at chosen points; tests/python/test_deepspeed_numbers.py
// compares every scheduler with DeepSpeed's own, step by step.
#include "config/LrSchedule.h"

#include <cmath>

#include <gtest/gtest.h>

#include "common/Error.h"

using namespace zeroshard;

namespace {

double lr(const LrSchedule& s, int64_t advanced, size_t group = 0) {
  return s.at(advanced).at(group).lr;
}

}  // namespace

TEST(LrSchedule, WithoutSchedulerEachGroupKeepsItsLr) {
  LrSchedule s(SchedulerConfig{}, {0.25, 0.5}, true);
  EXPECT_FALSE(s.active());
  EXPECT_DOUBLE_EQ(lr(s, 999, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr(s, 999, 1), 0.5);
}

TEST(LrSchedule, WarmupStartsOneAdvanceLateAsDeepSpeedsDoes) {
  SchedulerConfig c;
  c.type = "WarmupDecayLR";
  c.warmup_min_lr = std::vector<double>{0.0};
  c.warmup_max_lr = std::vector<double>{1.0};
  c.warmup_num_steps = 10;
  c.total_num_steps = 110;
  c.warmup_type = "linear";
  LrSchedule s(c, {0.3}, true);
  EXPECT_DOUBLE_EQ(lr(s, 0), 0.0);  // iteration -1: the lr the scheduler starts with
  EXPECT_DOUBLE_EQ(lr(s, 1), 0.0);  // iteration 0
  EXPECT_DOUBLE_EQ(lr(s, 6), 0.5);
  EXPECT_DOUBLE_EQ(lr(s, 11), 1.0);
  EXPECT_DOUBLE_EQ(lr(s, 61), 0.5);
  EXPECT_DOUBLE_EQ(lr(s, 201), 0.0);
  c.warmup_type = "log";  // DeepSpeed: log(it + 1) / log(warmup)
  EXPECT_DOUBLE_EQ(lr(LrSchedule(c, {0.3}, true), 5), (1.0 / std::log(10.0)) * std::log(5.0));
}

TEST(LrSchedule, WarmupLrLeftOutWarmsEachGroupToItsOwnLr) {
  SchedulerConfig c;
  c.type = "WarmupLR";
  c.warmup_num_steps = 4;
  c.warmup_type = "linear";
  LrSchedule s(c, {0.2, 0.4}, true);
  EXPECT_DOUBLE_EQ(lr(s, 3, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr(s, 3, 1), 0.2);
  EXPECT_DOUBLE_EQ(lr(s, 100, 1), 0.4);
  c.type = "WarmupDecayLR";  // DeepSpeed's default maximum there is 0.001
  c.total_num_steps = 10;
  EXPECT_DOUBLE_EQ(lr(LrSchedule(c, {0.2, 0.4}, true), 5, 1), 0.001);
}

TEST(LrSchedule, AListWithAnotherLengthThanTheGroupsIsRefusedByName) {
  SchedulerConfig c;
  c.type = "WarmupLR";
  c.warmup_max_lr = std::vector<double>{0.1, 0.2, 0.3};
  try {
    LrSchedule(c, {0.2, 0.4}, true);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'scheduler.params.warmup_max_lr' has 3 values but the "
                                         "optimizer has 2 parameter groups"),
              std::string::npos)
        << e.what();
  }
}

TEST(LrSchedule, CosineIsARatioOfEachGroupsLr) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.warmup_num_steps = 10;
  c.total_num_steps = 110;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.0;
  LrSchedule s(c, {1.0, 2.0}, true);
  EXPECT_DOUBLE_EQ(lr(s, 0), 0.0);  // DeepSpeed's cosine starts at 0
  EXPECT_DOUBLE_EQ(lr(s, 1, 1), 2.0 * 0.1);
  EXPECT_NEAR(lr(s, 60, 1), 2.0 * 0.5, 1e-12);  // iteration 59: halfway down the cosine
  EXPECT_NEAR(lr(s, 500, 0), 0.0, 1e-12);
}

TEST(LrSchedule, OneCycleCyclesTheLrUpAndBetaOneDown) {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.cycle_min_lr = std::vector<double>{0.1};
  c.cycle_max_lr = std::vector<double>{1.1};
  c.cycle_first_step_size = 4;
  c.decay_step_size = 2;
  c.decay_lr_rate = 1.0;
  LrSchedule s(c, {0.5}, true);
  const auto start = s.at(0).front();
  EXPECT_DOUBLE_EQ(start.lr, 0.1);
  EXPECT_DOUBLE_EQ(*start.beta1, 0.8);  // the lower bound, set when DeepSpeed builds it
  EXPECT_DOUBLE_EQ(*start.beta2, 0.99);
  const auto top = s.at(4).front();  // iteration 3: batch 4 of a cycle of 8
  EXPECT_DOUBLE_EQ(top.lr, 1.1);
  EXPECT_DOUBLE_EQ(*top.beta1, 0.8);
  EXPECT_NEAR(s.at(6).front().lr, 0.6, 1e-12);
  EXPECT_NEAR(*s.at(6).front().beta1, 0.85, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(10).front().lr, 0.1 / (1 + 1.0 * 1.0));  // 2 steps into the decay
  EXPECT_FALSE(LrSchedule(c, {0.5}, /*has_betas=*/false).at(3).front().beta1);
}

TEST(LrSchedule, RangeTestGrowsContinuouslyOrInStairs) {
  SchedulerConfig c;
  c.type = "LRRangeTest";
  c.lr_range_test_min_lr = std::vector<double>{0.01};
  c.lr_range_test_step_size = 4;
  c.lr_range_test_step_rate = 2.0;
  EXPECT_DOUBLE_EQ(lr(LrSchedule(c, {1.0}, true), 3), 0.01 * (1 + 2.0 * 0.75));
  c.lr_range_test_staircase = true;
  EXPECT_DOUBLE_EQ(lr(LrSchedule(c, {1.0}, true), 3), 0.01);
  EXPECT_DOUBLE_EQ(lr(LrSchedule(c, {1.0}, true), 5), 0.01 * 3);
}

TEST(LrSchedule, AnotherSchedulersKeyAndAMissingRequiredOneAreRefused) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.total_num_steps = 10;
  c.given = {"warmup_max_lr"};
  EXPECT_THROW(check_scheduler(c), Error);
  c.given = {};
  c.total_num_steps = 0;  // left out
  EXPECT_THROW(check_scheduler(c), Error);
  c.type = "OneCycle";
  EXPECT_THROW(check_scheduler(c), Error);  // cycle_min_lr and cycle_max_lr are required
}
