#pragma once
// Expert parallelism with ZeRO (DeepSpeed's MoE layer at ep_size > 1): what the engine
// composes it with, checked before any group is built. The experts' groups themselves are
// laid out by engine/GroupLayout.h, reduced by sharding/GradReducer.h over the edp ranks
// (engine/Communicators.h experts()), and gathered after the step over the same ranks.
#include <vector>

#include "plan/TrainingSettings.h"
#include "zeroshard/Types.h"

namespace zeroshard {

// Fails, naming what to change, where expert parallelism meets what is not composed with it
// yet: parameter offload, tensor or pipeline or sequence parallelism, MiCS or hpZ groups,
// optimizers whose step sums over every shard (Lamb), or no expert parameter to split.
void check_expert_parallel(const TrainingSettings& settings, const std::vector<NamedParam>& params);

// Fails naming `doing` (a checkpoint's save or load) with expert parallelism: each rank's
// experts are its own, and DeepSpeed's expert files are not written or read yet.
void refuse_expert_checkpoint(const TrainingSettings& settings, const char* doing);

}  // namespace zeroshard
