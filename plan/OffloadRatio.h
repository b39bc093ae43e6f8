#pragma once
// offload_optimizer.ratio auto, the Planner's part (plan/Planner.h): for stage 3 with the
// optimizer on the host and the parameters on the device, the split (plan/OptimizerSplit.h)
// that keeps the most units' optimizer state on the device while the device still fits.
#include "plan/Planner.h"

namespace zeroshard {

// Fills e.bytes and e.ratio for e.option under `resolved` (its ratio auto): the best split
// where one is allowed, else ratio 1.
void fill_offload_ratio(OptionEstimate& e, const ModelSpec& spec, const Config& resolved,
                        const WorldShape& world, const TrainingShape& shape,
                        const HardwareBudget& budget);

// Writes the chosen option's ratio into plan.config, with the reason.
void resolve_offload_ratio(Plan& plan, const OptionEstimate& chosen);

}  // namespace zeroshard
