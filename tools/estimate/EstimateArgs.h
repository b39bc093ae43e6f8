#pragma once
// zeroshard-estimate's command line, turned into the Planner's inputs.
#include <string>
#include <vector>

#include "config/Config.h"
#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"
#include "plan/Planner.h"

namespace zeroshard::estimate {

struct EstimateInputs {
  ModelSpec spec;
  Config config;
  WorldShape world;
  TrainingShape shape;
  HardwareBudget budget;
  bool json = false;
  std::string emit_config;               // path, or empty
  std::vector<std::string> assumptions;  // what was not given and what we assumed
  std::vector<std::string> warnings;     // from loading the config
};

// Throws Error with a one-line message on bad input. `help` is set for --help.
EstimateInputs parse_args(const std::vector<std::string>& args, bool& help);

const char* usage_text();

}  // namespace zeroshard::estimate
