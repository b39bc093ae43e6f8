#pragma once
// DeepSpeed's own model-states estimate (estimate_zero{2,3}_model_states_mem_needs),
// shown beside ours so users see where and why the two differ. Bytes; GPU per
// rank, CPU per node; CPU terms carry DeepSpeed's 1.5 buffer factor.
#include <cstdint>
#include <optional>

#include "plan/MemoryModel.h"

namespace zeroshard {

struct DeepSpeedEstimate {
  int64_t gpu_bytes = 0;  // per GPU
  int64_t cpu_bytes = 0;  // per node
};

// Empty where DeepSpeed's estimator has no formula for the option (stages 0/1, NVMe).
std::optional<DeepSpeedEstimate> deepspeed_estimate(const PlanOption& option, int64_t total_params,
                                                    int64_t largest_layer_params,
                                                    const WorldShape& world);

}  // namespace zeroshard
