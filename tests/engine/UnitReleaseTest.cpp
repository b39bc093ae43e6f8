// engine/UnitRelease: when a stage-3 unit's groups may go in backward.
#include "engine/UnitRelease.h"

#include <gtest/gtest.h>

using namespace zeroshard;

namespace {

// Units 0: trainable only; 1: trainable and frozen; 2: frozen only.
GroupTable three_units() {
  GroupTable groups;
  groups.set_unit_count(3);
  const std::pair<size_t, bool> layout[] = {{0, true}, {1, true}, {1, false}, {2, false}};
  size_t coordinator = 0;
  for (const auto& [unit, trainable] : layout) {
    GroupRecord record;
    record.unit = UnitId(unit);
    record.coordinator_unit = CoordinatorUnit(coordinator++);
    groups.add(std::move(record), trainable);
  }
  return groups;
}

}  // namespace

TEST(UnitRelease, AUnitWithoutFrozenParametersGoesWithItsGradients) {
  UnitRelease release;
  release.init(three_units());
  EXPECT_FALSE(release.inputs_need_grad(UnitId(0), false));  // nothing to wait for
  EXPECT_TRUE(release.grads_done(UnitId(0)));
}

TEST(UnitRelease, FrozenParametersWaitForTheInputsGradientsAfterTheTrainableOnes) {
  UnitRelease release;
  release.init(three_units());
  ASSERT_TRUE(release.inputs_need_grad(UnitId(1), false));
  EXPECT_FALSE(release.grads_done(UnitId(1)));  // a frozen LayerNorm before is still read
  EXPECT_TRUE(release.inputs_done(UnitId(1)));
  // The other order: the inputs' gradients first, then the last trainable one.
  release.reset();
  ASSERT_TRUE(release.inputs_need_grad(UnitId(1), false));
  EXPECT_FALSE(release.inputs_done(UnitId(1)));
  EXPECT_TRUE(release.grads_done(UnitId(1)));
}

TEST(UnitRelease, InputsThatNeedNoGradientLeaveTheUnitToItsGradients) {
  UnitRelease release;
  release.init(three_units());
  EXPECT_TRUE(release.grads_done(UnitId(1)));  // the first unit after a frozen embedding
}

TEST(UnitRelease, AFrozenUnitGoesWhenEveryForwardsInputsHaveTheirGradients) {
  UnitRelease release;
  release.init(three_units());
  ASSERT_TRUE(release.inputs_need_grad(UnitId(2), false));
  ASSERT_TRUE(release.inputs_need_grad(UnitId(2), false));  // used twice in forward
  EXPECT_FALSE(release.inputs_done(UnitId(2)));
  EXPECT_TRUE(release.inputs_done(UnitId(2)));
}

TEST(UnitRelease, ARecomputedForwardDoesNotCountTwice) {
  UnitRelease release;
  release.init(three_units());
  ASSERT_TRUE(release.inputs_need_grad(UnitId(2), false));
  EXPECT_FALSE(release.inputs_need_grad(UnitId(2), true));  // non-reentrant checkpointing
  EXPECT_TRUE(release.inputs_done(UnitId(2)));
  release.reset();  // reentrant checkpointing: forward without gradients, then recomputed
  EXPECT_TRUE(release.inputs_need_grad(UnitId(2), true));
  EXPECT_TRUE(release.inputs_done(UnitId(2)));
}

TEST(UnitRelease, UnknownInputsKeepTheUnitUntilBackwardEnds) {
  UnitRelease release;
  release.init(three_units());
  release.inputs_unknown(UnitId(1));
  EXPECT_FALSE(release.grads_done(UnitId(1)));  // never reported: stays till reset
  release.reset();
  EXPECT_TRUE(release.grads_done(UnitId(1)));
}

// A unit whose experts' parameters are a trainable group of their own (expert parallelism)
// goes with the last of its two groups' gradients, whichever comes first.
TEST(UnitRelease, AUnitWithTwoTrainableGroupsGoesWithTheLastOnesGradients) {
  GroupTable groups;
  groups.set_unit_count(1);
  for (size_t g = 0; g < 2; ++g) {
    GroupRecord record;
    record.unit = UnitId(0);
    record.coordinator_unit = CoordinatorUnit(g);
    record.expert = g == 1;
    groups.add(std::move(record), true);
  }
  UnitRelease release;
  release.init(groups);
  EXPECT_FALSE(release.grads_done(UnitId(0)));  // the experts' first: the router's still due
  EXPECT_TRUE(release.grads_done(UnitId(0)));
  release.reset();
  EXPECT_FALSE(release.grads_done(UnitId(0)));
}
