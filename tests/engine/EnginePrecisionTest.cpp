// bf16 and fp16 training on real ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/MemoryKinds.h"
#include "tests/engine/RankRuns.h"

using namespace zeroshard;
using namespace zeroshard::testing;

TEST(EnginePrecision, Bf16LossCurveFollowsFp32) {
  Scenario s;
  s.model = "transformer";
  s.stage = 2;
  s.steps = 50;
  s.lr = 1e-2;
  const auto fp32 = run_ranks(s, 2);
  s.dtype = "bf16";
  const auto bf16 = run_ranks(s, 2);
  ASSERT_EQ(fp32.size(), 2u);
  ASSERT_EQ(bf16.size(), 2u);
  for (int step = 0; step < s.steps; ++step) {
    const double want = fp32[0].stats[step][3].item<double>();
    const double got = bf16[0].stats[step][3].item<double>();
    EXPECT_NEAR(got, want, 0.02 * want) << "step " << step;
  }
  // and it learned something: the loss fell
  EXPECT_LT(bf16[0].stats[s.steps - 1][3].item<double>(), 0.9 * bf16[0].stats[0][3].item<double>());
}

TEST(EnginePrecision, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  Scenario s;
  s.model = "elementwise";
  s.dtype = "fp16";
  s.stage = 1;
  s.steps = 6;
  s.overflow_at = 3;
  const auto ranks = run_ranks(s, 2);
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& r : ranks) {
    for (int step = 0; step < s.steps; ++step) {
      EXPECT_EQ(r.stats[step][0].item<double>(), step == 3 ? 0.0 : 1.0) << "step " << step;
      EXPECT_EQ(r.stats[step][1].item<double>(), step < 3 ? 256.0 : 128.0) << "step " << step;
    }
    for (const auto& p : r.params) EXPECT_TRUE(at::isfinite(p).all().item<bool>());
  }
}

// DeepSpeed skips a window whose gradients hold an inf or a NaN in bf16 and fp32 too (its
// ZeRO optimizers' and BF16_Optimizer's check of the global norm), counting it in
// global_steps only; fp32 at stage 0 is torch's optimizer there, which steps.
TEST(EnginePrecision, AWindowWithInfiniteGradientsIsSkippedInBf16AndFp32AsDeepSpeedSkipsIt) {
  for (const auto& [dtype, stage] :
       std::vector<std::pair<std::string, int>>{{"bf16", 0}, {"fp32", 2}, {"fp32", 3}}) {
    Scenario s;
    s.model = "elementwise";
    s.dtype = dtype;
    s.stage = stage;
    s.steps = 5;
    s.overflow_at = 2;
    const auto ranks = run_ranks(s, 2);
    ASSERT_EQ(ranks.size(), 2u);
    for (const auto& r : ranks) {
      for (int step = 0; step < s.steps; ++step) {
        EXPECT_EQ(r.stats[step][0].item<double>(), step == 2 ? 0.0 : 1.0)
            << dtype << " stage " << stage << " step " << step;
      }
      for (const auto& p : r.params) EXPECT_TRUE(at::isfinite(p).all().item<bool>()) << dtype;
    }
  }
  Scenario s;
  s.model = "elementwise";
  s.stage = 0;
  s.steps = 3;
  s.overflow_at = 1;
  const auto ranks = run_ranks(s, 2);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0].stats[1][0].item<double>(), 1.0);
  EXPECT_FALSE(at::isfinite(ranks[0].params.front()).all().item<bool>());
}
