#include "common/TorchCompat.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

// The LibTorch headers we compile against must be the torch that the build's Python
// imports (the venv's PyPI torch, or Debian's pair in the trixie root), or the Python
// bindings would load a mismatched library.
TEST(TorchCompat, HeadersMatchTheBuildsPythonTorch) {
  const std::string command = std::string("cd / && '") + ZS_PYTHON_EXECUTABLE +
                              "' -c 'import torch; print(torch.__version__)' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[256] = {0};
  const bool read = fgets(buffer, sizeof buffer, pipe) != nullptr;
  pclose(pipe);
  ASSERT_TRUE(read) << command << " printed nothing";
  const std::string expected =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  EXPECT_EQ(std::string(buffer).rfind(expected, 0), 0u)
      << ZS_PYTHON_EXECUTABLE << "'s torch is " << buffer << ", the headers " << expected;
}

TEST(TorchCompat, SupportedRange) {
  EXPECT_TRUE(ZS_TORCH_AT_LEAST(2, 6));
  EXPECT_FALSE(ZS_TORCH_AT_LEAST(zeroshard::compat::kTorchMajor,
                                 zeroshard::compat::kTorchMinor + 1));
}
