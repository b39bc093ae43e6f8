#pragma once
// The Planner: fills every `auto` knob and picks where each kind of state lives,
// preferring, in order: no offload at the lowest stage that fits, optimizer to CPU,
// optimizer to NVMe, parameters to CPU, parameters to NVMe.
#include <optional>
#include <string>
#include <vector>

#include "config/Config.h"
#include "plan/AutoKnobs.h"
#include "plan/MemoryModel.h"
#include "plan/ModelSpec.h"
#include "plan/TrainingSettings.h"

namespace zeroshard {

struct HardwareBudget {
  int64_t device_bytes = 0;  // per rank
  int64_t host_bytes = 0;    // per node
  int64_t nvme_bytes = 0;    // per node; 0 = no NVMe
  // Device and host fraction kept free for the CUDA context, the allocator's
  // fragmentation, the OS and data loading.
  double headroom = 0.10;
};

struct OptionEstimate {
  PlanOption option;
  MemoryBreakdown bytes;  // per rank
  bool allowed = true;    // permitted by the config's fixed keys
  bool fits = false;
  std::string verdict;         // "fits", or the tier that overflows and by how much
  int64_t overflow_bytes = 0;  // sum over tiers of what does not fit (per node)
  // offload_optimizer.ratio auto, stage 3 with the optimizer on the host: the ratio that
  // keeps on the device as much of the optimizer as fits there (1: none of it).
  std::optional<double> ratio;
  // activation_checkpointing.mode auto: the blocks recomputed whole with which this option
  // fits (fewest_recomputed).
  std::optional<int64_t> recomputed;
};

struct Plan {
  PlanOption option;  // the recommended choice
  // Resolved: stage/offload set, no auto left but activation_checkpointing.mode's, which
  // the engine decides again for each batch it sees (fewest_recomputed).
  Config config;
  TrainingSettings settings;  // the same, as plain values for the training code
  MemoryBreakdown predicted;  // per rank, for the recommended choice
  bool fits = false;
  std::vector<std::string> reasons;  // one line per decision
  std::vector<OptionEstimate> options;
  std::string summary;  // one line: what was chosen, or by how much nothing fits

  // What a rank holds under this plan, for groups shaped as `spec` (the memory model's).
  MemoryBreakdown predict(const ModelSpec& spec, const WorldShape& world,
                          const TrainingShape& shape) const;
  // activation_checkpointing.mode auto for a batch the engine sees: fewest_recomputed of
  // the chosen option under this plan.
  Recomputed recomputed_for(const ModelSpec& spec, const WorldShape& world,
                            const TrainingShape& shape, const HardwareBudget& budget) const;

 private:
  Config running() const;  // the config as the engine runs it
};

// Every stage/offload choice, in the order of preference.
const std::vector<PlanOption>& plan_options();

// activation_checkpointing.mode auto: the fewest blocks recomputed whole (none first) with
// which `option` fits `budget` for `shape`'s batch, every tier judged as the planner judges
// it; every block (full) where even that does not fit.
Recomputed fewest_recomputed(const ModelSpec& spec, const PlanOption& option, const Config& config,
                             const WorldShape& world, const TrainingShape& shape,
                             const HardwareBudget& budget);

Plan make_plan(const ModelSpec& spec, const Config& config, const WorldShape& world,
               const TrainingShape& shape, const HardwareBudget& budget);

}  // namespace zeroshard
