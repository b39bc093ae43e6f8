#include "common/TorchCompat.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

// The LibTorch headers we compile against must be the torch that /usr/bin/python3
// imports where that is Debian's pair, or the Python bindings would load a mismatched
// library; elsewhere (a pip torch) this checks only that the macros are sane.
TEST(TorchCompat, HeadersMatchTheInstalledTorch) {
  EXPECT_GE(zeroshard::compat::kTorchMajor, 1);
  FILE* pipe =
      popen("/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null", "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[128] = {0};
  const bool read = fgets(buffer, sizeof buffer, pipe) != nullptr;
  pclose(pipe);
  if (!read) GTEST_SKIP() << "/usr/bin/python3 has no torch";
  const std::string expected =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  EXPECT_EQ(std::string(buffer).rfind(expected, 0), 0u) << "python torch " << buffer;
}

TEST(TorchCompat, GlooCapabilitiesFollowTheMajorVersion) {
  // Measured: 1.13's Gloo refuses flat collectives; 2.6's accepts them; AVG neither.
  EXPECT_EQ(zeroshard::compat::kGlooFlatAllGather, TORCH_VERSION_MAJOR >= 2);
  EXPECT_EQ(zeroshard::compat::kGlooFlatReduceScatter, TORCH_VERSION_MAJOR >= 2);
  EXPECT_FALSE(zeroshard::compat::kGlooAvg);
}
