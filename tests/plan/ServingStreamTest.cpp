// Serving's side of the Planner (plan/ServingStream.h): the rows and knobs of a model whose
// every unit is frozen.
#include "plan/ServingStream.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "plan/HfConfig.h"
#include "plan/Planner.h"
#include "tests/common/TestPaths.h"

using namespace zeroshard;

// Served (every unit frozen): the prefetch is two of the largest units, whatever the hidden
// size, since every forward gathers the whole model again.
TEST(Planner, AutoPrefetchOfAFrozenModelIsTwoUnits) {
  ModelSpec s =
      spec_from_hf_file(std::string(zeroshard::testing::source_dir()) + "/tests/data/hf/gpt2.json");
  Config c;
  c.zero.stage3_prefetch_bucket_size.reset();
  std::vector<std::string> reasons;
  EXPECT_EQ(resolve_auto_knobs(c, s, WorldShape{1, 1}, reasons).zero.stage3_prefetch_bucket_size,
            9 * 768 * 768 / 10);
  s.unit_frozen.assign(s.unit_params.size(), true);
  reasons.clear();
  const Config r = resolve_auto_knobs(c, s, WorldShape{1, 1}, reasons);
  EXPECT_EQ(r.zero.stage3_prefetch_bucket_size, 2 * s.largest_unit());
  const std::string all = fmt::format("{}", fmt::join(reasons, "\n"));
  EXPECT_NE(all.find("stage3_prefetch_bucket_size: auto -> " +
                     std::to_string(2 * s.largest_unit()) + " (inference: two units ahead"),
            std::string::npos)
      << all;
}
