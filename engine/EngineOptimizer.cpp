// EngineBuilder's optimizer (engine/EngineBuilder.h): which trainable groups keep their state
// on the host, the optimizer made for them, its groups opening and storing the NVMe shards
// they update, and its step moved into backward (overlap_step).
#include <cstdint>
#include <vector>

#include "common/Alignment.h"
#include "common/Error.h"
#include "engine/Communicators.h"
#include "engine/EngineBuilder.h"
#include "engine/ParamHome.h"
#include "engine/StepPipeline.h"
#include "optim/MakeShardOptimizer.h"
#include "optim/OffloadOptimizer.h"
#include "plan/OptimizerSplit.h"
#include "sharding/Collectives.h"

namespace zeroshard {

void EngineBuilder::make_optimizer(bool on_cpu, const std::vector<bool>& on_host) {
  OptimizerSite site;
  site.ledger = &e_->ledger_;
  site.swap = e_->swap_.get();
  site.model_on_cpu = on_cpu;
  site.on_host = on_host;
  site.sum_norms = [e = e_](at::Tensor& norms) {
    // Without sharded optimizer state every rank steps every whole parameter: nothing to sum.
    if (e->plan_.settings.stage.shards_optimizer())
      e->comms_->shards().all_reduce_sum(norms).wait();
  };
  ShardOptimizerChoice chosen = make_shard_optimizer(e_->plan_.settings, site);
  e_->pipeline_->set_optimizer(std::move(chosen.optimizer), chosen.offloaded, chosen.external);
}

std::vector<bool> EngineBuilder::optimizer_on_host(const std::vector<GroupSpec>& layout) const {
  std::vector<int64_t> numels;
  for (const auto& spec : layout) {
    if (!spec.trainable) continue;
    int64_t numel = 0;
    for (const auto& p : spec.params) numel += p.param.numel();
    // (split only at stage 3)
    numels.push_back(padded_shard_numel(numel, e_->dist_.shard_size(spec.expert)));
  }
  return zeroshard::optimizer_on_host(numels, e_->plan_.settings.optimizer_host_ratio);
}

void EngineBuilder::hook_param_home(ParamHome* home) {
  e_->pipeline_->offloaded()->on_group(
      [e = e_, at = home](size_t g) {
        if (e->unit_of_trainable(g) >= 0) at->open_for_update(e->unit_of_trainable(g));
      },
      [e = e_, at = home](size_t g) {
        if (e->unit_of_trainable(g) >= 0) at->store(e->unit_of_trainable(g));
      });
}

// offload_optimizer.overlap_step (optim/OverlappedStep.h), as the Planner resolved it:
// auto is on for a model on a GPU where the step inside backward is exact (plan/Planner.h).
// A true that the plan's own choices rule out (an offload device left auto, then chosen
// none) is refused here, naming why.
void EngineBuilder::make_overlapped_step(int threads) {
  if (!e_->plan_.settings.overlap_step) return;
  if (const auto& obstacle = e_->plan_.settings.overlap_step_obstacle) {
    fail(
        "config key 'zero_optimization.offload_optimizer.overlap_step' is true, but {}; "
        "allowed: false or auto",
        *obstacle);
  }
  e_->pipeline_->overlap_step(threads);
}

}  // namespace zeroshard
