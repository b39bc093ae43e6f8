// Every ready-made file in configs/ loads without warnings and means what its name says.
#include <filesystem>
#include <map>

#include <gtest/gtest.h>

#include "config/Config.h"
#include "tests/common/TestPaths.h"

using namespace zeroshard;
namespace fs = std::filesystem;

TEST(ConfigFiles, EveryShippedConfigLoadsCleanly) {
  struct Expect {
    int stage;
    OffloadDevice optimizer;
    OffloadDevice params;
  };
  const std::map<std::string, Expect> expected{
      {"zero1.yaml", {1, OffloadDevice::None, OffloadDevice::None}},
      {"zero2.yaml", {2, OffloadDevice::None, OffloadDevice::None}},
      {"zero3.yaml", {3, OffloadDevice::None, OffloadDevice::None}},
      {"zero2_cpu_offload.yaml", {2, OffloadDevice::Cpu, OffloadDevice::None}},
      {"zero3_cpu_offload.yaml", {3, OffloadDevice::Cpu, OffloadDevice::Cpu}},
      {"zero3_nvme.yaml", {3, OffloadDevice::Nvme, OffloadDevice::Nvme}},
  };
  size_t seen = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(zeroshard::testing::source_dir()) / "configs")) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const LoadedConfig loaded = load_config_file(entry.path().string());
    EXPECT_TRUE(loaded.warnings.empty());
    ++seen;
    const auto it = expected.find(name);
    if (it == expected.end()) continue;
    EXPECT_EQ(loaded.config.zero.stage, it->second.stage);
    EXPECT_EQ(loaded.config.zero.offload_optimizer.device, it->second.optimizer);
    EXPECT_EQ(loaded.config.zero.offload_param.device, it->second.params);
  }
  EXPECT_GE(seen, expected.size());
}
