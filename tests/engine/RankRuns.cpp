#include "tests/engine/RankRuns.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include "tests/common/TestPaths.h"
#include "tools/launch/RankLauncher.h"

namespace zeroshard::testing {
namespace fs = std::filesystem;
using launch::launch_ranks;

namespace {
const std::string kWorker = std::string(binary_dir()) + "/tests/engine_worker";

}  // namespace

std::vector<RankOutput> run_ranks(const Scenario& s, int world) {
  const std::string prefix =
      (fs::temp_directory_path() / ("zs_eq_" + std::to_string(getpid()))).string();
  const auto result = launch_ranks(world, kWorker, [&] {
    std::vector<std::string> args{prefix};
    for (const auto& a : s.to_args()) args.push_back(a);
    return args;
  }());
  EXPECT_TRUE(result.all_ok()) << result.describe();
  std::vector<RankOutput> outputs;
  for (int r = 0; r < world && result.all_ok(); ++r) {
    std::vector<at::Tensor> t;
    const std::string path = prefix + ".rank" + std::to_string(r) + ".pt";
    torch::load(t, path);
    fs::remove(path);
    RankOutput o;
    o.memory = t.back();
    t.pop_back();
    o.stats = t.back().view({-1, 4});
    t.pop_back();
    o.buffers = t.back();
    t.pop_back();
    o.params = t;
    outputs.push_back(o);
  }
  return outputs;
}

}  // namespace zeroshard::testing
