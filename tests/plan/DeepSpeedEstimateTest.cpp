#include "plan/DeepSpeedEstimate.h"

#include <gtest/gtest.h>

#include "common/Bytes.h"

using namespace zeroshard;
using OD = OffloadDevice;

namespace {
DeepSpeedEstimate ds(const PlanOption& o) {
  return *deepspeed_estimate(o, 1'000'000'000, 100'000'000, WorldShape{1, 8});
}
}  // namespace

// DeepSpeed's formulas by hand for P = 1e9, largest layer 1e8, 1 node x 8 GPUs.
TEST(DeepSpeedEstimate, Zero2) {
  EXPECT_EQ(ds({2, OD::None, OD::None}).gpu_bytes, 4'000'000'000 + 2'000'000'000);
  EXPECT_EQ(ds({2, OD::None, OD::None}).cpu_bytes, 48'000'000'000);
  EXPECT_EQ(ds({2, OD::Cpu, OD::None}).gpu_bytes, 2'000'000'000);
  EXPECT_EQ(ds({2, OD::Cpu, OD::None}).cpu_bytes, 48'000'000'000);  // 1e9 x max(32, 16) x 1.5
}

TEST(DeepSpeedEstimate, Zero3) {
  EXPECT_EQ(ds({3, OD::None, OD::None}).gpu_bytes, 400'000'000 + 2'250'000'000);
  EXPECT_EQ(ds({3, OD::None, OD::None}).cpu_bytes, 4'800'000'000);
  EXPECT_EQ(ds({3, OD::Cpu, OD::None}).gpu_bytes, 400'000'000 + 250'000'000);
  EXPECT_EQ(ds({3, OD::Cpu, OD::None}).cpu_bytes, 24'000'000'000);
  EXPECT_EQ(ds({3, OD::Cpu, OD::Cpu}).gpu_bytes, 400'000'000);
  EXPECT_EQ(ds({3, OD::Cpu, OD::Cpu}).cpu_bytes, 27'000'000'000);
}

TEST(DeepSpeedEstimate, NoFormulaWhereDeepSpeedHasNone) {
  EXPECT_FALSE(deepspeed_estimate({0, OD::None, OD::None}, 1, 1, WorldShape{}));
  EXPECT_FALSE(deepspeed_estimate({1, OD::None, OD::None}, 1, 1, WorldShape{}));
  EXPECT_FALSE(deepspeed_estimate({3, OD::Nvme, OD::Nvme}, 1, 1, WorldShape{}));
}

// DeepSpeed's documentation (memory.html) for t5-3b (2851M params) on 1 node x 8 GPUs
// prints 15.93 GB per GPU without offload and 5.31 / 127.48 GB with CPU offload.
TEST(DeepSpeedEstimate, ReproducesDeepSpeedDocsExample) {
  const int64_t p = 2'851'569'664;
  const auto none = *deepspeed_estimate({2, OD::None, OD::None}, p, 0, WorldShape{1, 8});
  const auto cpu = *deepspeed_estimate({2, OD::Cpu, OD::None}, p, 0, WorldShape{1, 8});
  EXPECT_EQ(format_gib(static_cast<double>(none.gpu_bytes)), "15.93");
  EXPECT_EQ(format_gib(static_cast<double>(cpu.gpu_bytes)), "5.31");
  EXPECT_EQ(format_gib(static_cast<double>(cpu.cpu_bytes)), "127.48");
}
