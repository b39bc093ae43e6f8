#pragma once
// The config as training reads it: plain values the Planner resolved (Plan::settings),
// so training code never unwraps an `auto`. The engine and the layers under it decide
// from these alone; the resolved Config stays in Plan::config whole, for checkpoints,
// reports and the ranks' agreement on what they built.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/AdamHyper.h"
#include "common/QuantizedLayout.h"
#include "common/ZeroStage.h"
#include "config/Config.h"

namespace zeroshard {

struct OffloadSettings {
  OffloadDevice device = OffloadDevice::None;  // auto only in a plan where nothing fits
  std::string nvme_path;
  int64_t buffer_count = 0;
  bool offloaded() const { return device != OffloadDevice::None; }
};

// The optimizer the config names, as optim/MakeShardOptimizer.h picks one.
struct OptimizerSettings {
  std::string type = "AdamW";
  // A torch.optim class or a client's optimizer object, which the Python package steps.
  bool external = false;
  bool lamb() const { return !external && type == "Lamb"; }
  double lamb_max_coeff = 10.0;  // DeepSpeed's FusedLamb's trust-ratio clamp
  double lamb_min_coeff = 0.01;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  AdamHyper defaults;  // each parameter group's values unless the group sets its own
};

enum class Precision { Fp32, Bf16, Fp16 };

// The swap engine's settings (offload/IoEngine.h's IoOptions), from the config's `aio`.
struct AioSettings {
  int64_t block_size = 0;
  int queue_depth = 0;
  int rings = 0;
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
  ZeroStage stage;
  Precision compute = Precision::Fp32;     // bf16, fp16 or neither
  std::optional<Precision> communication;  // unset: each gradient in its dtype
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
  // Ranks each tensor-parallel parameter is split across; ZeRO works over the others.
  int64_t tensor_parallel_size = 1;
  // Pipeline stages; ZeRO works inside each stage's ranks.
  int64_t pipeline_parallel_size = 1;
  // Ranks that split each sequence (config/Config.h says how they count).
  int64_t sequence_parallel_size = 1;
  // Ranks that split the experts (config/Config.h says how they are laid out).
  int64_t expert_parallel_size = 1;
  // Frozen stage-3 shards kept quantized (bits 0: not).
  QuantizedLayout weight_quantization{0, 64, false};
  OffloadSettings offload_optimizer;
  // The share of the optimizer's shards (by elements) that steps on the host, the first
  // groups staying on the device (offload_optimizer.ratio at stage 3 with cpu; else 1).
  double optimizer_host_ratio = 1.0;
  bool overlap_step = false;  // the offloaded optimizer steps inside backward
  // Why overlap_step cannot be true in this run (config/Config.h), if something rules it out.
  std::optional<std::string> overlap_step_obstacle;
  OffloadSettings offload_param;
  int64_t param_max_in_cpu = 0;  // offload_param nvme: shard elements kept in host RAM
  AioSettings aio;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // 0: no clipping
  std::chrono::milliseconds comm_timeout{0};
  bool check_collectives = false;  // the config's key, or ZS_CHECK_COLLECTIVES=1
  LossScaleSettings fp16;
  OptimizerSettings optimizer;
  SchedulerConfig scheduler;  // the config's learning-rate schedule (type "none": none)

  // The micro-batch that ends a gradient accumulation window (DeepSpeed's boundary):
  // the `micro_steps`-th since the run began, counting from 1.
  bool ends_accumulation(int64_t micro_steps) const {
    return micro_steps % gradient_accumulation_steps == 0;
  }
};

// The config optimizer's values (AdamW: decoupled decay; Adam: L2).
AdamHyper adam_defaults(const OptimizerConfig& resolved);

// From a resolved config; a key still `auto` is the Planner's bug and fails naming it.
TrainingSettings settings_of(const Config& resolved);

}  // namespace zeroshard
