#pragma once
// Predicted bytes per rank, per tier and kind, for one stage/offload choice.
// The derivation of every term is written down in docs/memory-model.md.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/MemoryKinds.h"
#include "config/Config.h"
#include "plan/ModelSpec.h"
#include "plan/PipelineStages.h"

namespace zeroshard {

struct WorldShape {
  int64_t nodes = 1;
  int64_t ranks_per_node = 1;
  // Ranks that split each tensor-parallel parameter, consecutive inside a node; ZeRO shards
  // over the others (engine/ParallelDims.h), and the model's counts are one rank's slices.
  int64_t tensor_parallel = 1;
  int64_t ranks() const { return nodes * ranks_per_node; }
  int64_t data_parallel_ranks() const { return ranks() / tensor_parallel; }
  int64_t data_parallel_per_node() const { return ranks_per_node / tensor_parallel; }
};

// Blocks the engine recomputes in backward (activation_checkpointing.mode): `whole` of the
// layers keep only their input, `ops` keep their input and the outputs of their matmuls
// and attention kernels (selective "op"); the others keep everything.
struct Recomputed {
  int64_t whole = 0;
  int64_t ops = 0;
};

struct TrainingShape {
  int64_t seq = 1;
  int64_t micro_batch = 1;
  // The model recomputes every block itself (Hugging Face's gradient checkpointing).
  bool activation_checkpointing = false;
  // The engine's policy: set from the config by predict_memory (recomputed_layers); with
  // mode auto, given (plan/Planner.h fewest_recomputed).
  Recomputed recomputed;
  // Where the blocks' saved activations wait for backward (activation_checkpointing.offload,
  // set by predict_memory): the device, or host RAM or NVMe, with two blocks' on the device
  // (the one whose backward runs, the one fetched ahead) and, with NVMe, two in host RAM
  // on their way. Not counted for pipeline stages (not composed).
  Tier activation_offload = Tier::Device;
  // Ranks each sequence is split across (Ulysses: the config's sequence_parallel_size,
  // set by the planner): a rank keeps its slice's activations, attention's for the whole
  // sequence with 1/sequence_parallel of the heads (docs/memory-model.md).
  int64_t sequence_parallel = 1;
  // Those ranks run torch's ring attention (context parallelism), not Ulysses.
  bool ring_attention = false;
  // ALST's tiled compute (bindings/zeroshard/_sequence/tiled_compute.py), 0 where off: each
  // dense MLP run in `mlp_tiles` tiles of the rank's tokens (TiledMLP: it keeps its input
  // alone; backward computes one tile again), the logits with their loss in `logits_tiles`
  // (TiledFusedLogitsLoss: one tile's logits at a time, the gradients computed in forward
  // held until backward).
  int64_t mlp_tiles = 0;
  int64_t logits_tiles = 0;
  // Micro-batches whose activations are held at once: 1, or a pipeline stage's under its
  // schedule (plan/PipelineStages.h).
  int64_t in_flight = 1;
  // A pipeline stage's micro-batches a step (0: no pipeline): torch's schedules keep every
  // micro-batch's output on the last stage, to return them merged from step().
  int64_t pipeline_micro_batches = 0;
  // Several pipeline stages on this rank (interleaved schedules): each one's blocks (the
  // spec's blocks are their sum), the one ending in the head if it holds it, and its
  // schedule's order as plan/PipelineStages.h parts_in_flight gives it; activations are
  // counted at the step that holds the most bytes. Empty: one stage, in_flight.
  std::vector<int64_t> part_layers;
  int64_t head_part = -1;
  std::vector<PartsStep> part_steps;
  // Stages 2-3 reducing once per step (GradReducer::reduce_once_per_window): the whole
  // gradient buffer is held across the micro-batches, as at stage 1.
  bool grads_held_in_window = false;
  // Training on the CPU: the "device" is host memory, so offloaded gradients need no
  // pinned staging copy.
  bool device_is_host = false;
  // Served (zeroshard.init_inference): no backward; micro_batch sequences whose KV cache
  // holds seq tokens each, on the device or (PlanOption::kv_cache_on_host) in host RAM.
  bool inference = false;
  bool kv_cache_on_host = false;
};

// One row of the estimator's table: a ZeRO stage and where optimizer state and
// parameters live (None = on the device).
struct PlanOption {
  int stage = 0;
  OffloadDevice optimizer = OffloadDevice::None;
  OffloadDevice params = OffloadDevice::None;
  // Served: the KV cache in host RAM, each layer's moved to the device for its turn and back
  // (transformers' offloaded cache), where it does not fit on the device beside the rest.
  bool kv_cache_on_host = false;
  std::string label() const;  // "stage 3, optimizer nvme, params cpu"
  bool operator==(const PlanOption& o) const {
    return stage == o.stage && optimizer == o.optimizer && params == o.params &&
           kv_cache_on_host == o.kv_cache_on_host;
  }
};

class MemoryBreakdown {
 public:
  int64_t& at(Tier tier, Kind kind) { return bytes_[index(tier, kind)]; }
  int64_t at(Tier tier, Kind kind) const { return bytes_[index(tier, kind)]; }
  int64_t total(Tier tier) const;

 private:
  static size_t index(Tier t, Kind k) {
    return static_cast<size_t>(t) * kNumKinds + static_cast<size_t>(k);
  }
  std::array<int64_t, kNumTiers * kNumKinds> bytes_{};
};

// Transformer activations of one micro-batch (0 when the model's shape is unknown).
int64_t activation_bytes(const ModelSpec& spec, const TrainingShape& shape, int compute_bytes);
// The blocks the config's activation_checkpointing.mode recomputes for this model and batch:
// full every layer, selective every Nth whole (or every layer's ops), memory_budget the
// fewest whole layers that keep the activations within the budget's fraction of what they
// are with none (every layer where even that is more), auto shape.recomputed (what the
// planner chose for the budget: plan/Planner.h fewest_recomputed).
Recomputed recomputed_layers(const ModelSpec& spec, const Config& config,
                             const TrainingShape& shape);
// What activation_checkpointing.offload keeps off the device (on shape.activation_offload's
// tier): every block's saved activations, per rank; 0 without offload.
int64_t offloaded_activation_bytes(const ModelSpec& spec, const TrainingShape& shape, int kl);
// With NVMe, the host RAM those bytes pass through on their way out and back: two blocks'.
int64_t offload_staging_bytes(const ModelSpec& spec, const TrainingShape& shape, int kl);
// The key-value cache of `shape.micro_batch` sequences of `shape.seq` tokens, in the
// compute dtype (transformers' DynamicCache), on the device.
int64_t kv_cache_bytes(const ModelSpec& spec, const TrainingShape& shape, int compute_bytes);

// Elements of a stage-sharded copy of all parameters that one rank owns, with each
// unit padded so every rank's shard is equal and aligned; of the trainable ones only
// (what has gradients and optimizer state). An expert unit is sharded over the ranks
// holding its experts (ModelSpec::sharding_ranks).
int64_t shard_numel(const ModelSpec& spec, int64_t ranks);
int64_t trainable_shard_numel(const ModelSpec& spec, int64_t ranks);
// The flat buffers whole: each unit padded to its ranks' shards (of the trainable ones
// only: the gradient buffers).
int64_t full_numel(const ModelSpec& spec, int64_t ranks);
int64_t trainable_full_numel(const ModelSpec& spec, int64_t ranks);
// The same per trainable unit, in unit order.
std::vector<int64_t> trainable_shard_numels(const ModelSpec& spec, int64_t ranks);

// The offload_optimizer.ratio that splits the optimizer at `option`: the config's at
// stage 3 with the optimizer on the host, else 1 (every shard where the option puts it).
double split_ratio(const PlanOption& option, const Config& config);

// Elements of this rank's optimizer shard kept on the device by offload_optimizer.ratio
// below 1 (stage 3, optimizer cpu; plan/OptimizerSplit.h); 0 otherwise. `config` resolved.
int64_t resident_optimizer_numel(const ModelSpec& spec, const PlanOption& option,
                                 const Config& config, int64_t ranks);

// Ranks each state is sharded over at `stage`: mics_shard_size where it is set (> 0) and
// the stage shards, else all `ranks`. `config.zero.mics_shard_size` must be resolved.
int64_t sharding_ranks(const Config& config, int stage, int64_t ranks);

// `config` must be resolved (no auto left); its stage and offload devices are
// ignored in favour of `option`.
// Stage 3: where each sharded unit's parameter shard lives (whole units stay on the
// device). With nvme, shards are kept in host RAM in unit order while they fit in
// offload_param.max_in_cpu elements; the rest go to NVMe. The Engine places them with
// this same function, so plan and ledger agree.
struct ParamPlacement {
  int64_t device_numel = 0, host_numel = 0, nvme_numel = 0;
  int64_t largest_nvme_shard = 0;
  int64_t largest_offloaded_shard = 0;  // in host RAM or on NVMe
  int64_t trainable_nvme_numel = 0;     // of nvme_numel, shards with optimizer state
  // The same in bytes at rest: k_l an element, or a frozen shard's quantized layout.
  int64_t device_bytes = 0, host_bytes = 0, nvme_bytes = 0;  // nvme: regions aligned to 4,096
  int64_t largest_nvme_bytes = 0;
  int64_t largest_shard = 0;         // elements, of any sharded unit
  std::vector<int64_t> nvme_shards;  // numel of each shard on NVMe, in unit order
  std::vector<size_t> in_host;       // nvme: units whose shard stays in host RAM
};
// `max_in_cpu`: offload_param.max_in_cpu, the shard elements kept in host RAM with nvme.
// `compute_bytes` and `quantized` (bits 0: none) size the bytes at rest.
ParamPlacement place_param_shards(const ModelSpec& spec, OffloadDevice device, int64_t max_in_cpu,
                                  int64_t ranks, int64_t compute_bytes = 1,
                                  const QuantizedLayout& quantized = {0, 64, false});

MemoryBreakdown predict_memory(const ModelSpec& spec, const PlanOption& option,
                               const Config& config, const WorldShape& world,
                               const TrainingShape& shape);

}  // namespace zeroshard
