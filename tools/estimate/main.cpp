// zeroshard-estimate: what fits where, before launch.
#include <cstdio>
#include <fstream>
#include <iostream>

#include <yaml-cpp/yaml.h>

#include "common/Error.h"
#include "common/Files.h"
#include "plan/LongestSequence.h"
#include "plan/Planner.h"
#include "tools/estimate/EstimateArgs.h"
#include "tools/estimate/EstimateReport.h"

namespace {

constexpr int kExitNothingFits = 1;
constexpr int kExitBadInput = 2;

// Serving's config has no optimizer or scheduler (zeroshard.init_inference refuses them).
void write_config(const std::string& path, const zeroshard::Config& config, bool inference) {
  std::string text = zeroshard::emit_config_yaml(config);
  if (inference) {
    YAML::Node root = YAML::Load(text);
    root.remove("optimizer");
    root.remove("scheduler");
    YAML::Emitter out;
    out << root;
    text = std::string(out.c_str()) + "\n";
  }
  zeroshard::write_file_atomically(
      path,
      fmt::format("# written by zeroshard-estimate; load with zeroshard.{}\n",
                  inference ? "init_inference(model, config=...)" : "initialize(config=...)") +
          text,
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
    if (in.pipeline_stages > 1) {
      std::vector<Plan> plans;
      bool fits = true;
      for (const auto& stage : in.stages) {
        plans.push_back(make_plan(stage.spec, in.config, in.world, stage.shape, in.budget));
        fits = fits && plans.back().fits;
      }
      std::cout << (in.json ? estimate::render_pipeline_json(in, plans)
                            : estimate::render_pipeline_table(in, plans));
      if (!in.emit_config.empty()) {  // one config for every stage: the heaviest's plan
        write_config(in.emit_config, plans[estimate::heaviest_stage(plans)].config, false);
        if (!in.json)
          std::cout << "wrote " << in.emit_config << " (stage " << estimate::heaviest_stage(plans)
                    << "'s plan)\n";
      }
      return fits ? 0 : kExitNothingFits;
    }
    const Plan plan = make_plan(in.spec, in.config, in.world, in.shape, in.budget);
    estimate::Largest largest;
    if (in.max_seq)
      largest.seq = longest_sequences(in.spec, in.config, in.world, in.shape, in.budget);
    if (in.max_micro_batch)
      largest.micro_batch =
          largest_micro_batches(in.spec, in.config, in.world, in.shape, in.budget);
    std::cout << (in.json ? estimate::render_json(in, plan, largest)
                          : estimate::render_table(in, plan, largest));
    if (!in.emit_config.empty()) {
      write_config(in.emit_config, plan.config, in.inference);
      if (!in.json) std::cout << "wrote " << in.emit_config << "\n";
    }
    return plan.fits ? 0 : kExitNothingFits;
  } catch (const std::exception& e) {
    std::cerr << "zeroshard-estimate: error: " << e.what() << "\n";
    return kExitBadInput;
  }
}
