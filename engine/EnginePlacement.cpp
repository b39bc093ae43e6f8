// Where the engine's state goes: the optimizer that steps the shards (picked by
// optim/MakeShardOptimizer.h), where stage-3 parameter shards live, and the step that
// overlaps backward.
#include <algorithm>

#include "common/Alignment.h"
#include "common/Error.h"
#include "engine/Communicators.h"
#include "engine/EngineImpl.h"
#include "engine/ParamHome.h"
#include "engine/StepPipeline.h"
#include "optim/MakeShardOptimizer.h"
#include "optim/OffloadOptimizer.h"
#include "optim/SwapSpace.h"
#include "plan/MemoryModel.h"
#include "plan/OptimizerSplit.h"
#include "sharding/Collectives.h"
#include "sharding/FlatParamGroup.h"

namespace zeroshard {

void EngineImpl::make_optimizer(bool on_cpu, const std::vector<bool>& on_host) {
  OptimizerSite site;
  site.ledger = &ledger_;
  site.swap = swap_.get();
  site.model_on_cpu = on_cpu;
  site.on_host = on_host;
  site.sum_norms = [this](at::Tensor& norms) {
    // Without sharded optimizer state every rank steps every whole parameter: nothing to sum.
    if (plan_.settings.stage.shards_optimizer()) comms_->shards().all_reduce_sum(norms).wait();
  };
  ShardOptimizerChoice chosen = make_shard_optimizer(plan_.settings, site);
  pipeline_->set_optimizer(std::move(chosen.optimizer), chosen.offloaded, chosen.external);
}

std::vector<bool> EngineImpl::optimizer_on_host(const std::vector<GroupSpec>& layout) const {
  std::vector<int64_t> numels;
  for (const auto& spec : layout) {
    if (!spec.trainable) continue;
    int64_t numel = 0;
    for (const auto& p : spec.params) numel += p.param.numel();
    numels.push_back(padded_shard_numel(numel, shard_count()));  // (split only at stage 3)
  }
  return zeroshard::optimizer_on_host(numels, plan_.settings.optimizer_host_ratio);
}

// Stage-3 parameter offload: each sharded unit's shard goes where the memory model
// puts it (the same function decides both).
std::unique_ptr<ParamHome> EngineImpl::place_param_shards(
    const std::vector<FlatParamGroup*>& sharded) {
  const TrainingSettings& z = plan_.settings;
  const OffloadDevice device = z.offload_param.device;
  if (!z.offload_param.offloaded()) return nullptr;
  const ParamPlacement placed =
      zeroshard::place_param_shards(spec_of_groups(), device, z.param_max_in_cpu, shard_count());
  std::vector<bool> on_nvme(sharded.size(), device == OffloadDevice::Nvme);
  for (size_t u : placed.in_host) on_nvme[groups_[GroupId(u)].coordinator_unit->value] = false;
  for (size_t u = 0; u < sharded.size(); ++u) {
    if (!on_nvme[u]) sharded[u]->set_shard_tier(Tier::Host, &ledger_);
  }
  if (device != OffloadDevice::Nvme) return nullptr;
  const std::string& dir = swap_->open_dir(z.offload_param.nvme_path);  // makes io() first
  auto home = std::make_unique<ParamHome>(sharded, on_nvme, swap_->io(), dir,
                                          z.offload_param.buffer_count, &ledger_, device_.where);
  OffloadOptimizer* offloaded = pipeline_->offloaded();
  if (!offloaded && (z.optimizer.external || z.optimizer.lamb())) {
    fail(
        "config key 'zero_optimization.offload_param.device' is 'nvme' with optimizer {}; "
        "allowed: offload_param.device cpu, or the optimizer Adam or AdamW offloaded to cpu or "
        "nvme, whose step brings each NVMe shard in",
        z.optimizer.type);
  }
  if (!offloaded) {  // the offloaded optimizer brings each NVMe shard in for its update
    fail(
        "config key 'zero_optimization.offload_param.device' is 'nvme' with the optimizer "
        "on the device; allowed: 'zero_optimization.offload_optimizer.device' cpu or nvme "
        "with parameters on NVMe, or offload_param.device cpu");
  }
  offloaded->on_group(
      [this, at = home.get()](size_t g) {
        if (unit_of_trainable(g) >= 0) at->open_for_update(unit_of_trainable(g));
      },
      [this, at = home.get()](size_t g) {
        if (unit_of_trainable(g) >= 0) at->store(unit_of_trainable(g));
      });
  return home;
}

// offload_optimizer.overlap_step (optim/OverlappedStep.h), as the Planner resolved it:
// auto is on for a model on a GPU where the step inside backward is exact (plan/Planner.h).
// A true that the plan's own choices rule out (an offload device left auto, then chosen
// none) is refused here, naming why.
void EngineImpl::make_overlapped_step(int threads) {
  if (!plan_.settings.overlap_step) return;
  if (const auto& obstacle = plan_.settings.overlap_step_obstacle) {
    fail(
        "config key 'zero_optimization.offload_optimizer.overlap_step' is true, but {}; "
        "allowed: false or auto",
        *obstacle);
  }
  pipeline_->overlap_step(threads);
}

}  // namespace zeroshard
