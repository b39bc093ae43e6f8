// Per-rank MemoryLedger bytes of real multi-rank runs against the memory model.
#include <gtest/gtest.h>

#include "common/MemoryKinds.h"
#include "tests/sharding/RankRuns.h"

using namespace zeroshard;
using namespace zeroshard::testing;

// What each rank's MemoryLedger holds at rest equals the Planner's prediction for the
// same model, stage and precision (the model-state kinds), within 2%.
TEST(EngineMemory, LedgerMatchesThePlanEveryStage) {
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (int stage : {0, 1, 2}) {
      Scenario s;
      s.model = "transformer";
      s.stage = stage;
      s.dtype = dtype;
      s.steps = 2;
      SCOPED_TRACE(dtype + " stage " + std::to_string(stage));
      const auto ranks = run_ranks(s, 2);
      ASSERT_EQ(ranks.size(), 2u);
      for (Kind kind : {Kind::Params, Kind::MasterParams, Kind::Grads, Kind::GradsFp32,
                        Kind::OptimizerStates}) {
        const auto k = static_cast<int64_t>(kind);
        const double current = ranks[0].memory[k * 3].item<double>();
        const double predicted = ranks[0].memory[k * 3 + 1].item<double>();
        EXPECT_NEAR(current, predicted, 0.02 * predicted) << kind_name(kind);
      }
    }
  }
}

TEST(EngineMemory, ModelStatesShrinkWithStageAsTheSeedFormulaSays) {
  auto states = [](int stage, int world) {
    Scenario s;
    s.model = "transformer";
    s.stage = stage;
    s.steps = 1;
    s.bucket = 100'000;  // one group: padding stays negligible
    const auto r = run_ranks(s, world);
    double bytes = 0;
    for (Kind kind :
         {Kind::Params, Kind::MasterParams, Kind::Grads, Kind::GradsFp32, Kind::OptimizerStates}) {
      bytes += r.at(0).memory[static_cast<int64_t>(kind) * 3].item<double>();
    }
    return bytes;
  };
  const double stage0 = states(0, 4);
  // fp32, d = 4: stage 0 holds 4p (params) + 4p (grads) + 8p (Adam) = 16p; stage 1
  // 4p + 4p + 8p/4 = 10p; stage 2 4p + 4p/4 (fp32 shard) + 8p/4 = 7p.
  EXPECT_NEAR(states(1, 4) / stage0, 10.0 / 16, 0.02);
  EXPECT_NEAR(states(2, 4) / stage0, 7.0 / 16, 0.02);
}
