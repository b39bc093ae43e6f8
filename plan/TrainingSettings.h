#pragma once
// The config as training reads it: plain values the Planner resolved (Plan::settings),
// so training code never unwraps an `auto`. Only what the engine reads is here; the
// resolved Config stays in Plan::config for checkpoints and reports.
#include <chrono>
#include <cstdint>
#include <string>

#include "common/AdamHyper.h"
#include "config/Config.h"

namespace zeroshard {

struct OffloadSettings {
  std::string nvme_path;
  int64_t buffer_count = 0;
};

struct LossScaleSettings {
  bool enabled = false;  // fp16: dynamic (static_scale 0) or static loss scaling
  double static_scale = 0;
  int64_t initial_scale_power = 0;
  int64_t window = 0;
  int64_t hysteresis = 0;
  double min_scale = 0;
};

struct TrainingSettings {
  int stage = 0;
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 0;  // elements
  int64_t stage3_prefetch_bucket_size = 0;
  int64_t stage3_max_live_parameters = 0;
  int64_t stage3_param_persistence_threshold = 0;
  int64_t sub_group_size = 0;
  int64_t mics_shard_size = -1;  // > 0: states sharded inside groups of this many ranks
  // > 1 (stage 3): a secondary copy of the parameters sharded inside groups of this many
  // ranks serves backward's gathers (ZeRO++ hpZ)
  int64_t hpz_partition_size = 1;
  OffloadSettings offload_optimizer;
  bool overlap_step = false;  // the offloaded optimizer steps inside backward
  OffloadSettings offload_param;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // 0: no clipping
  std::chrono::milliseconds comm_timeout{0};
  bool check_collectives = false;  // the config's key, or ZS_CHECK_COLLECTIVES=1
  LossScaleSettings fp16;
  AdamHyper optimizer;  // the config's optimizer values: each parameter group's defaults
};

// The config optimizer's values (AdamW: decoupled decay; Adam: L2).
AdamHyper adam_defaults(const OptimizerConfig& resolved);

// From a resolved config; a key still `auto` is the Planner's bug and fails naming it.
TrainingSettings settings_of(const Config& resolved);

}  // namespace zeroshard
