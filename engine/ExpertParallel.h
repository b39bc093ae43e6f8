#pragma once
// Expert parallelism with ZeRO (DeepSpeed's MoE layer at ep_size > 1): what the engine
// composes it with, checked before any group is built. The experts' groups themselves are
// laid out by engine/GroupLayout.h, reduced by sharding/GradReducer.h over the edp ranks
// (engine/Communicators.h experts()), and gathered after the step over the same ranks.
#include <vector>

#include "engine/Communicators.h"
#include "engine/GroupTable.h"
#include "plan/TrainingSettings.h"
#include "sharding/GradReducer.h"
#include "sharding/ParamCoordinator.h"
#include "zeroshard/Types.h"

namespace zeroshard {

// Fails, naming what to change, where expert parallelism meets what is not composed with it
// yet: parameter offload, tensor or pipeline or sequence parallelism, MiCS or hpZ groups,
// optimizers whose step sums over every shard (Lamb), or no expert parameter to split.
void check_expert_parallel(const TrainingSettings& settings, const std::vector<NamedParam>& params);

// With experts split: the reducer's expert groups reduced over the experts' ranks
// (GradReducer::set_experts); nothing to do without expert parallelism.
void reduce_experts_apart(const GroupTable& groups, Communicators& comms, GradReducer& reducer);

// Stage 3 with experts split: each expert group's gathers, in the walk and for reads, go
// over the experts' own groups (Communicators::params(true), touches(true)); nothing to do
// without expert parallelism.
void gather_experts_apart(const GroupTable& groups, Communicators& comms,
                          ParamCoordinator& coordinator);

}  // namespace zeroshard
