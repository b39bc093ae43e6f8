#pragma once
// A fresh, empty folder under the build tree for one test's swap files.
#include <filesystem>
#include <string>

#include "tests/common/TestPaths.h"

namespace zeroshard::testing {

inline std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(binary_dir()) / "test-scratch" / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace zeroshard::testing
