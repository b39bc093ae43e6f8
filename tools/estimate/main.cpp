// zeroshard-estimate: what fits where, before launch.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "common/Error.h"
#include "common/Files.h"
#include "plan/Planner.h"
#include "tools/estimate/EstimateArgs.h"
#include "tools/estimate/EstimateReport.h"

namespace {

constexpr int kExitNothingFits = 1;
constexpr int kExitBadInput = 2;

void write_config(const std::string& path, const zeroshard::Config& config) {
  zeroshard::write_file_atomically(
      path,
      "# written by zeroshard-estimate; load with zeroshard.initialize(config=...)\n" +
          zeroshard::emit_config_yaml(config),
      "--emit-config");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zeroshard;
  try {
    bool help = false;
    const auto in = estimate::parse_args({argv + 1, argv + argc}, help);
    if (help) {
      std::cout << estimate::usage_text();
      return 0;
    }
    const Plan plan = make_plan(in.spec, in.config, in.world, in.shape, in.budget);
    std::cout << (in.json ? estimate::render_json(in, plan) : estimate::render_table(in, plan));
    if (!in.emit_config.empty()) {
      write_config(in.emit_config, plan.config);
      if (!in.json) std::cout << "wrote " << in.emit_config << "\n";
    }
    return plan.fits ? 0 : kExitNothingFits;
  } catch (const std::exception& e) {
    std::cerr << "zeroshard-estimate: error: " << e.what() << "\n";
    return kExitBadInput;
  }
}
