#pragma once
// zeroshard-estimate's output: the human table and the JSON form of a Plan.
#include <string>

#include "plan/Planner.h"
#include "tools/estimate/EstimateArgs.h"

namespace zeroshard::estimate {

std::string render_table(const EstimateInputs& in, const Plan& plan);
std::string render_json(const EstimateInputs& in, const Plan& plan);

}  // namespace zeroshard::estimate
