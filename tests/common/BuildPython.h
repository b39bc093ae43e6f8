#pragma once
// The first line the build's Python (python_executable(), set by tests/CMakeLists.txt)
// prints for `code`, without its newline; "" if it printed nothing. Run from / so that
// no folder of this tree shadows a package.
#include <cstdio>
#include <string>

#include "tests/common/TestPaths.h"

namespace zeroshard::testing {

inline std::string build_python_prints(const std::string& code) {
  const std::string command =
      std::string("cd / && '") + python_executable() + "' -c '" + code + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[256] = {0};
  const bool read = fgets(buffer, sizeof buffer, pipe) != nullptr;
  pclose(pipe);
  std::string out = read ? buffer : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace zeroshard::testing
