#include "common/TorchCompat.h"

#include <string>

#include <gtest/gtest.h>

#include "tests/common/BuildPython.h"
#include "tests/common/TestPaths.h"

// The LibTorch headers we compile against must be the torch that the build's Python
// imports (the venv's PyPI torch, or Debian's pair in the trixie root), or the Python
// bindings would load a mismatched library.
TEST(TorchCompat, HeadersMatchTheBuildsPythonTorch) {
  const std::string version =
      zeroshard::testing::build_python_prints("import torch; print(torch.__version__)");
  ASSERT_FALSE(version.empty()) << zeroshard::testing::python_executable() << " printed nothing";
  const std::string expected =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  EXPECT_EQ(version.rfind(expected, 0), 0u)
      << zeroshard::testing::python_executable() << "'s torch is " << version << ", the headers "
      << expected;
}

TEST(TorchCompat, SupportedRange) {
  EXPECT_TRUE(ZS_TORCH_AT_LEAST(2, 6));
  EXPECT_FALSE(
      ZS_TORCH_AT_LEAST(zeroshard::compat::kTorchMajor, zeroshard::compat::kTorchMinor + 1));
}
