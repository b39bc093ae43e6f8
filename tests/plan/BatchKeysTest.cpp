// DeepSpeed's batch keys as resolve_auto_knobs settles them (plan/AutoKnobs.cpp).
#include <gtest/gtest.h>

#include "common/Error.h"
#include "plan/AutoKnobs.h"
#include "tests/plan/ToySpec.h"

using namespace zeroshard;
using zeroshard::testing::toy_spec;

TEST(Planner, TrainBatchSizeDerivesAccumulationOrMustAgree) {
  Config c;
  c.train_batch_size = 64;
  c.train_micro_batch_size_per_gpu = 2;
  std::vector<std::string> reasons;
  EXPECT_EQ(
      resolve_auto_knobs(c, toy_spec(), WorldShape{1, 8}, reasons).gradient_accumulation_steps, 4);
  c.gradient_accumulation_steps = 3;
  try {
    resolve_auto_knobs(c, toy_spec(), WorldShape{1, 8}, reasons);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size (64), train_micro_batch_size_per_gpu "
                                         "(2) and gradient_accumulation_steps (3) do not fit 8 "
                                         "ranks (2 x 3 x 8 = 48)"),
              std::string::npos)
        << e.what();
  }
}

// DeepSpeed's count (its config's world_size, world / sequence_parallel_size): a sequence-
// parallel group's ranks share their samples.
TEST(Planner, SequenceParallelRanksCountOnceInTheBatch) {
  Config c;
  c.train_batch_size = 64;
  c.train_micro_batch_size_per_gpu = 2;
  c.sequence_parallel_size = 4;
  std::vector<std::string> reasons;
  EXPECT_EQ(
      resolve_auto_knobs(c, toy_spec(), WorldShape{1, 8}, reasons).gradient_accumulation_steps, 16);
  c.sequence_parallel_size = 3;
  try {
    resolve_auto_knobs(c, toy_spec(), WorldShape{1, 8}, reasons);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config key 'sequence_parallel_size' is 3, but 8 "
                                         "data-parallel ranks do not split into groups of 3; "
                                         "allowed: a divisor of 8"),
              std::string::npos)
        << e.what();
  }
}

// DeepSpeed's table: whichever of the three is left out follows from the others.
TEST(Planner, BatchKeysLeftOutFollowDeepSpeedsRule) {
  auto resolve = [](std::optional<int64_t> total, std::optional<int64_t> micro,
                    std::optional<int64_t> accumulation) {
    Config c;
    c.train_batch_size = total;
    c.train_micro_batch_size_per_gpu = micro;
    c.gradient_accumulation_steps = accumulation;
    std::vector<std::string> reasons;
    const Config r = resolve_auto_knobs(c, toy_spec(), WorldShape{1, 2}, reasons);
    return std::make_pair(*r.train_micro_batch_size_per_gpu, *r.gradient_accumulation_steps);
  };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(resolve(16, std::nullopt, std::nullopt), P(8, 1));  // DeepSpeed's cifar example
  EXPECT_EQ(resolve(16, std::nullopt, 2), P(4, 2));
  EXPECT_EQ(resolve(16, 2, std::nullopt), P(2, 4));
  EXPECT_EQ(resolve(std::nullopt, 3, std::nullopt), P(3, 1));
  EXPECT_EQ(resolve(std::nullopt, 3, 5), P(3, 5));
  EXPECT_EQ(resolve(std::nullopt, std::nullopt, 4), P(1, 4));    // DeepSpeed stops; here 1
  EXPECT_THROW(resolve(15, std::nullopt, std::nullopt), Error);  // odd over 2 ranks
  EXPECT_THROW(resolve(16, 3, std::nullopt), Error);
}
