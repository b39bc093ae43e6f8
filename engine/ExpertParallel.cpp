#include "engine/ExpertParallel.h"

#include <algorithm>
#include <utility>

#include "common/Error.h"

namespace zeroshard {

void check_expert_parallel(const TrainingSettings& z, const std::vector<NamedParam>& params) {
  const int64_t ep = z.expert_parallel_size;
  if (ep <= 1) return;
  const auto refuse = [ep](const std::string& what, const std::string& allowed) {
    fail(
        "expert parallelism (the MoE layers' ep_size {}) with {}: not composed in zeroshard yet; "
        "allowed: {}, or ep_size 1 (every rank holding every expert)",
        ep, what, allowed);
  };
  if (z.hpz_partition_size > 1 && z.stage.shards_parameters())
    refuse("zero_optimization.zero_hpz_partition_size", "leave it out");
  if (z.offload_param.offloaded())
    refuse("zero_optimization.offload_param", "the parameters on the device");
  if (!z.stage.shards_optimizer() && z.offload_optimizer.offloaded()) {
    // CPU Adam's sum of squares comes whole, not apart by the ranks sharing each gradient.
    refuse("zero_optimization.offload_optimizer at stage 0", "stages 1 and 2 for the offload");
  }
  if (z.tensor_parallel_size > 1) refuse("tensor parallelism", "tensor_parallel.autotp_size 1");
  if (z.pipeline_parallel_size > 1) refuse("pipeline stages", "pipeline.stages 1");
  if (z.sequence_parallel_size > 1) refuse("sequence parallelism", "sequence_parallel_size 1");
  if (z.mics_shard_size > 0) refuse("zero_optimization.mics_shard_size", "leave it out");
  if (z.optimizer.lamb()) {  // (Adafactor, likewise, is refused by the Python package)
    refuse("optimizer 'Lamb' (its step sums each parameter's norms over every shard)",
           "an elementwise optimizer (Adam, AdamW, a torch.optim class such as SGD)");
  }
  if (std::none_of(params.begin(), params.end(), [](const NamedParam& p) { return p.expert; })) {
    fail(
        "the MoE layers' ep_size is {}, but no parameter is an expert's; allowed: a model "
        "whose MoE layers hold the experts",
        ep);
  }
}

void reduce_experts_apart(const GroupTable& groups, Communicators& comms, GradReducer& reducer) {
  if (!comms.experts()) return;
  std::vector<bool> expert;  // per trainable group, in the reducer's order
  for (const GroupId id : groups.trainable()) expert.push_back(groups[id].expert);
  reducer.set_experts(comms.experts(), std::move(expert));
}

void gather_experts_apart(const GroupTable& groups, Communicators& comms,
                          ParamCoordinator& coordinator) {
  if (!comms.experts()) return;
  std::vector<Collectives*> gathers, touches;
  for (const GroupRecord& g : groups) {  // coordinator units in group order
    if (!g.coordinator_unit) continue;
    gathers.push_back(g.expert ? &comms.params(true) : nullptr);
    touches.push_back(g.expert ? &comms.touches(true) : nullptr);
  }
  coordinator.set_unit_groups(std::move(gathers), std::move(touches));
}

}  // namespace zeroshard
