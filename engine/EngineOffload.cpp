// The Engine's offload wiring: which optimizer steps the shards, the swap directories
// and I/O engine, and where stage-3 parameter shards live.
#include <algorithm>

#include "common/Alignment.h"
#include "common/Error.h"
#include "engine/Communicators.h"
#include "engine/EngineImpl.h"
#include "engine/ExternalOptimizer.h"
#include "engine/OffloadOptimizer.h"
#include "engine/ParamHome.h"
#include "engine/StepPipeline.h"
#include "engine/SwapSpace.h"
#include "offload/CpuAdam.h"
#include "plan/MemoryModel.h"
#include "plan/OptimizerSplit.h"
#include "sharding/GradReducer.h"
#include "sharding/LambOptimizer.h"
#include "sharding/ParamCoordinator.h"
#include "sharding/ResidentOptimizer.h"
#include "sharding/SplitOptimizer.h"

namespace zeroshard {
namespace {

// Shards in host memory step through CpuAdam: one vectorized pass instead of eight
// ATen passes (5.5x faster on this machine's 2 cores, at the bandwidth limit).
AdamKernel cpu_adam_kernel() {
  return [](const AdamHyper& h, int64_t step, double grad_scale, at::Tensor& master,
            at::Tensor& grad, at::Tensor& m, at::Tensor& v) {
    CpuAdamStep s;
    s.hyper = h;
    s.step = step;
    s.grad_scale = grad_scale;
    cpu_adam_step(s, master.data_ptr<float>(), grad.contiguous().data_ptr<float>(),
                  m.data_ptr<float>(), v.data_ptr<float>(), master.numel());
  };
}

}  // namespace

void EngineImpl::make_optimizer(bool on_cpu, const std::vector<bool>& on_host) {
  const TrainingSettings& z = plan_.settings;
  const OffloadDevice device = plan_.option.optimizer;
  if (plan_.config.optimizer.type == "Lamb") {  // config/Config.cpp refuses it with NVMe
    const OptimizerConfig& c = plan_.config.optimizer;
    LambOptions o;
    o.max_coeff = c.max_coeff.value_or(o.max_coeff);
    o.min_coeff = c.min_coeff.value_or(o.min_coeff);
    o.bias_correction = c.bias_correction;
    o.eps_inside_sqrt = c.eps_inside_sqrt;
    const Tier tier = device == OffloadDevice::Cpu ? Tier::Host : Tier::Device;
    // Stage 0: every rank steps every whole parameter, so there is nothing to sum.
    NormReduce reduce = [this](at::Tensor& norms) {
      if (plan_.settings.stage >= 1) comms_->shards().all_reduce_sum(norms).wait();
    };
    pipeline_->set_optimizer(std::make_unique<LambOptimizer>(o, tier, &ledger_, reduce), nullptr);
    return;
  }
  if (plan_.config.optimizer.external) {
    // With NVMe the masters stay in host RAM and the state is paged (engine/ExternalOptimizer.h).
    const Tier tier = device == OffloadDevice::None ? Tier::Device : Tier::Host;
    std::optional<ExternalStateSwap> swap;
    if (device == OffloadDevice::Nvme) {
      swap.emplace();
      swap->dir = swap_->open_dir(z.offload_optimizer.nvme_path);
      swap->io = swap_->io();
      swap->sub_group_numel = z.sub_group_size;
      swap->buffer_count = z.offload_optimizer.buffer_count;
      swap->page_lock = !on_cpu;
    }
    auto external = std::make_unique<ExternalOptimizer>(plan_.config.optimizer.type, tier, &ledger_,
                                                        std::move(swap));
    ExternalOptimizer* kind = external.get();
    pipeline_->set_optimizer(std::move(external), nullptr, kind);
    return;
  }
  if (device == OffloadDevice::None) {
    pipeline_->set_optimizer(std::make_unique<ResidentOptimizer>(
                                 &ledger_, on_cpu ? cpu_adam_kernel() : fused_adam_kernel()),
                             nullptr);
    return;
  }
  OffloadOptimizerOptions o;
  o.device = device;
  o.sub_group_numel = z.sub_group_size;
  o.buffer_count = z.offload_optimizer.buffer_count;
  o.page_lock = !on_cpu;
  const bool all_on_host = std::find(on_host.begin(), on_host.end(), false) == on_host.end();
  // StepPipeline::update reads them when nothing clips and every shard is on the host.
  o.sum_grad_squares = z.gradient_clipping <= 0 && all_on_host;
  if (device == OffloadDevice::Nvme) {
    o.swap_dir = swap_->open_dir(z.offload_optimizer.nvme_path);
    o.io = swap_->io();
  }
  auto offloaded = std::make_unique<OffloadOptimizer>(o, &ledger_);
  if (all_on_host) {
    OffloadOptimizer* typed = offloaded.get();
    pipeline_->set_optimizer(std::move(offloaded), typed);
    return;
  }
  // offload_optimizer.ratio < 1: the first groups step on the device. What steps only an
  // offloaded optimizer (the overlapped step, NVMe parameter shards) is refused with it
  // (config/ConfigChecks.cpp), so the pipeline sees no offloaded optimizer.
  auto resident = std::make_unique<ResidentOptimizer>(
      &ledger_, on_cpu ? cpu_adam_kernel() : fused_adam_kernel());
  pipeline_->set_optimizer(
      std::make_unique<SplitOptimizer>(std::move(resident), std::move(offloaded), on_host),
      nullptr);
}

std::vector<bool> EngineImpl::optimizer_on_host(const std::vector<GroupSpec>& layout) const {
  std::vector<int64_t> numels;
  for (const auto& spec : layout) {
    if (!spec.trainable) continue;
    int64_t numel = 0;
    for (const auto& p : spec.params) numel += p.param.numel();
    numels.push_back(padded_shard_numel(numel, shard_count()));  // (split only at stage 3)
  }
  return zeroshard::optimizer_on_host(numels, split_ratio(plan_.option, plan_.config));
}

// Stage-3 parameter offload: each sharded unit's shard goes where the memory model
// puts it (the same function decides both).
std::unique_ptr<ParamHome> EngineImpl::place_param_shards(
    const std::vector<FlatParamGroup*>& sharded) {
  const auto& op = plan_.config.zero.offload_param;
  const OffloadDevice device = plan_.option.params;
  if (device == OffloadDevice::None) return nullptr;
  const ParamPlacement placed =
      zeroshard::place_param_shards(spec_of_groups(), device, op, shard_count());
  std::vector<bool> on_nvme(sharded.size(), device == OffloadDevice::Nvme);
  for (size_t u : placed.in_host) on_nvme[groups_[GroupId(u)].coordinator_unit->value] = false;
  for (size_t u = 0; u < sharded.size(); ++u) {
    if (!on_nvme[u]) sharded[u]->set_shard_tier(Tier::Host, &ledger_);
  }
  if (device != OffloadDevice::Nvme) return nullptr;
  const std::string& dir = swap_->open_dir(op.nvme_path);  // makes io() first
  auto home = std::make_unique<ParamHome>(sharded, on_nvme, swap_->io(), dir,
                                          plan_.settings.offload_param.buffer_count, &ledger_,
                                          device_.where);
  OffloadOptimizer* offloaded = pipeline_->offloaded();
  if (!offloaded && (plan_.config.optimizer.external || plan_.config.optimizer.type == "Lamb")) {
    fail(
        "config key 'zero_optimization.offload_param.device' is 'nvme' with optimizer {}; "
        "allowed: offload_param.device cpu, or the optimizer Adam or AdamW offloaded to cpu or "
        "nvme, whose step brings each NVMe shard in",
        plan_.config.optimizer.type);
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

// offload_optimizer.overlap_step (engine/OverlappedStep.h), as the Planner resolved it:
// auto is on for a model on a GPU where the step inside backward is exact (plan/Planner.h).
// A true that the plan's own choices rule out (an offload device left auto, then chosen
// none) is refused here, naming why.
void EngineImpl::make_overlapped_step(int threads) {
  if (!plan_.settings.overlap_step) return;
  if (const auto obstacle = overlap_step_obstacle(plan_.config)) {
    fail(
        "config key 'zero_optimization.offload_optimizer.overlap_step' is true, but {}; "
        "allowed: false or auto",
        obstacle->why);
  }
  pipeline_->overlap_step(threads);
}

}  // namespace zeroshard
