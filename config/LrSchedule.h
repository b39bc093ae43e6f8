#pragma once
// Learning rate per optimizer step, with DeepSpeed's scheduler names:
//   none: the optimizer's lr throughout.
//   WarmupLR: warmup_min_lr -> warmup_max_lr over warmup_num_steps (log or linear),
//             then warmup_max_lr.
//   WarmupDecayLR: WarmupLR, then linear decay to 0 at total_num_steps.
//   WarmupCosineLR: WarmupLR, then cosine decay to warmup_min_lr at total_num_steps.
#include <cstdint>

#include "config/Config.h"

namespace zeroshard {

// `step` counts optimizer steps taken before this one (0 for the first). `config`
// must be resolved (no auto left).
double learning_rate(const Config& config, int64_t step);

}  // namespace zeroshard
