// A rank that dies mid-step makes every other rank stop with an error that names it,
// well within the configured timeout, instead of hanging.
#include <gtest/gtest.h>

#include "tests/common/TestPaths.h"
#include "tests/engine/TestModels.h"
#include "tools/launch/RankLauncher.h"

using namespace zeroshard::testing;
using namespace zeroshard::launch;

namespace {
const std::string kWorker = std::string(zeroshard::testing::binary_dir()) + "/tests/engine_worker";
}

TEST(RankFailure, SurvivorsStopAndNameTheLostRank) {
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Scenario s;
    s.stage = stage;
    s.die_at = 2;
    s.timeout = 20;
    std::vector<std::string> args{"/tmp/zs_failure"};
    for (const auto& a : s.to_args()) args.push_back(a);
    const LaunchResult r = launch_ranks(3, kWorker, args, std::chrono::seconds(60));
    ASSERT_FALSE(r.timed_out) << r.describe();
    EXPECT_EQ(r.ranks[2].exit_code, 3) << r.describe();
    for (int rank : {0, 1}) {
      EXPECT_EQ(r.ranks[rank].exit_code, 1) << r.describe();
      // A survivor that noticed late may be listed too; the lost rank always is.
      EXPECT_NE(r.ranks[rank].output.find("2 did not respond"), std::string::npos) << r.describe();
    }
    EXPECT_LT(r.seconds, 20.0) << "not within the configured timeout";
  }
}
