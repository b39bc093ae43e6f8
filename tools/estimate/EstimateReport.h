#pragma once
// zeroshard-estimate's output: the human table and the JSON form of a Plan.
#include <string>
#include <vector>

#include "plan/LongestSequence.h"
#include "plan/Planner.h"
#include "tools/estimate/EstimateArgs.h"

namespace zeroshard::estimate {

// --max-seq's lengths and --max-micro-batch's sizes, per option of plan_options() (each
// empty where not asked).
struct Largest {
  std::vector<Fitting> seq;
  std::vector<Fitting> micro_batch;
};
std::string render_table(const EstimateInputs& in, const Plan& plan, const Largest& largest = {});
std::string render_json(const EstimateInputs& in, const Plan& plan, const Largest& largest = {});
// --pp: one plan per stage (in.stages), each stage's row and the heaviest stage's bytes.
std::string render_pipeline_table(const EstimateInputs& in, const std::vector<Plan>& plans);
std::string render_pipeline_json(const EstimateInputs& in, const std::vector<Plan>& plans);
// The stage whose recommended choice saves the most memory (the latest in plan_options'
// order, then the most device bytes): its config, emitted for every stage.
size_t heaviest_stage(const std::vector<Plan>& plans);

}  // namespace zeroshard::estimate
