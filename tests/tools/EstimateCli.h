#pragma once
// zeroshard-estimate run as a user runs it, for the tests of tools/estimate: a real process,
// its exit code and output.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/common/TestPaths.h"

namespace zeroshard::testing {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A directory of this test process's own.
inline fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("zs_cli_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

inline CliRun estimate(const std::string& args) {
  const fs::path dir = scratch();
  const std::string cmd = std::string(binary_dir()) + "/tools/zeroshard-estimate " + args + " >" +
                          (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
}

// A Hugging Face config.json of tests/data/hf.
inline std::string hf(const std::string& name) {
  return std::string(source_dir()) + "/tests/data/hf/" + name;
}

}  // namespace zeroshard::testing
