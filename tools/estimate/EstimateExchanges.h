#pragma once
// zeroshard-estimate's account of the all-to-alls of expert and sequence parallelism
// (plan/Exchanges.h) under the recommended choice: lines for the table, an object for the
// JSON; empty and null where neither is on.
#include <string>

#include <nlohmann/json.hpp>

#include "plan/Planner.h"
#include "tools/estimate/EstimateArgs.h"

namespace zeroshard::estimate {

std::string exchange_lines(const EstimateInputs& in, const Plan& plan);
nlohmann::json exchange_json(const EstimateInputs& in, const Plan& plan);

}  // namespace zeroshard::estimate
