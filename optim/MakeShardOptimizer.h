#pragma once
// The one place that picks the optimizer stepping this rank's shards, from the run's
// settings: Lamb, a torch.optim class (stepped from Python), Adam/AdamW resident on the
// model's device, offloaded to host RAM or NVMe, or split between the two
// (offload_optimizer.ratio < 1).
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/MemoryLedger.h"
#include "optim/ShardOptimizer.h"
#include "plan/TrainingSettings.h"

namespace zeroshard {

class ExternalOptimizer;
class OffloadOptimizer;
class SwapSpace;

// Where the optimizer runs: what the factory cannot read from the settings.
struct OptimizerSite {
  MemoryLedger* ledger = nullptr;
  SwapSpace* swap = nullptr;  // opens the NVMe swap directories
  bool model_on_cpu = true;   // the model (and so the gradients) live in host memory
  // The i-th trainable group's shard steps on the host (plan/OptimizerSplit.h).
  std::vector<bool> on_host;
  // Lamb's per-shard norms summed over the ranks sharing the optimizer state (a no-op
  // where every rank steps every whole parameter).
  std::function<void(at::Tensor&)> sum_norms;
};

struct ShardOptimizerChoice {
  std::unique_ptr<ShardOptimizer> optimizer;
  OffloadOptimizer* offloaded = nullptr;  // the optimizer itself, when all of it is offloaded
  ExternalOptimizer* external = nullptr;  // the optimizer itself, a torch.optim class's
};

ShardOptimizerChoice make_shard_optimizer(const TrainingSettings& settings,
                                          const OptimizerSite& site);

}  // namespace zeroshard
