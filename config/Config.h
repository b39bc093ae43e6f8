#pragma once
// Every knob of a zeroshard job, named as DeepSpeed names it so configs carry over.
// A std::optional that is empty means `auto`: the Planner fills it (Plan::config
// holds the resolved copy, with no auto left).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/QuantizedLayout.h"
#include "config/TorchOptimizers.h"

namespace zeroshard {

enum class OffloadDevice { Auto, None, Cpu, Nvme };
const char* offload_device_name(OffloadDevice d);

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  bool pin_memory = false;
  std::optional<int64_t> buffer_count = 4;
  // Step each gradient shard with CPU Adam while backward goes on for the rest, in the
  // backward that ends the accumulation window (exact: the same arithmetic as after
  // backward). auto: on for a model on a GPU where that is exact; true; false.
  std::string overlap_step = "auto";
  // The share of the optimizer's shards (by elements) that steps on the offload device;
  // the rest keeps its state on the GPU and steps there (DeepSpeed's ZeRO-Offload++
  // "Twin-Flow"). 1: all of it, DeepSpeed's default. Below 1: stage 3 with device cpu,
  // the last units to the host (plan/OptimizerSplit.h). auto: the Planner puts on the
  // device as much as fits there.
  std::optional<double> ratio = 1.0;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  bool pin_memory = false;
  std::optional<int64_t> buffer_count = 5;
  std::optional<int64_t> max_in_cpu = 1'000'000'000;
};

// activation_checkpointing.offload: what the model's blocks save for backward, kept in host
// RAM (cpu) or on NVMe from their forward to their backward
// (bindings/zeroshard/_activations/offload.py); plan/MemoryModel.h counts it on that tier.
struct ActivationOffloadConfig {
  OffloadDevice device = OffloadDevice::None;
  std::string nvme_path;
  bool pin_memory = true;  // page-locked host buffers, so copies from a GPU are asynchronous
};

// Sizes are in elements, as in DeepSpeed.
struct ZeroConfig {
  std::optional<int64_t> stage = 0;
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  std::optional<int64_t> reduce_bucket_size = 500'000'000;
  std::optional<int64_t> allgather_bucket_size = 500'000'000;
  std::optional<int64_t> stage3_prefetch_bucket_size = 50'000'000;
  std::optional<int64_t> stage3_max_live_parameters = 1'000'000'000;
  std::optional<int64_t> stage3_param_persistence_threshold = 100'000;
  std::optional<int64_t> sub_group_size = 1'000'000'000;
  // MiCS: states sharded inside groups of this many consecutive ranks and replicated
  // across groups, so gathers and reduce-scatters stay inside a group (a node) and only
  // one all-reduce of each gradient shard crosses groups. -1: shard across every rank.
  std::optional<int64_t> mics_shard_size = -1;
  // ZeRO++ hpZ (stage 3): states stay sharded across every rank, and after forward's
  // gather each rank keeps a secondary copy of the parameters sharded inside its group
  // of this many consecutive ranks (a node), so backward's gathers stay inside the
  // group. 1: no secondary copy.
  std::optional<int64_t> hpz_partition_size = 1;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

struct AioConfig {
  std::optional<int64_t> block_size = 1 << 20;
  std::optional<int64_t> queue_depth = 8;
  std::optional<int64_t> intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

// Weights stored and streamed quantized (DeepSpeed's weight_quantization.
// quantized_initialization, ZeRO-Inference's int8/int4): each stage-3 shard of a frozen
// unit kept as num_bits codes with an fp32 scale (and minimum, when not symmetric) per
// group of group_size elements, dequantized into the compute dtype as it is gathered.
struct WeightQuantization {
  std::optional<int64_t> num_bits = 0;  // 0: off; 4 or 8
  std::optional<int64_t> group_size = 64;
  std::optional<int64_t> group_dim = 1;  // groups run along each matrix's rows (its last dim)
  bool symmetric = false;
  bool enabled() const { return num_bits.value_or(0) > 0; }
  QuantizedLayout layout() const {  // bits 0 when off
    return {num_bits.value_or(0), group_size.value_or(64), symmetric};
  }
};

struct Fp16Config {
  bool enabled = false;
  std::optional<double> loss_scale = 0.0;  // 0 means dynamic loss scaling
  std::optional<int64_t> initial_scale_power = 16;
  std::optional<int64_t> loss_scale_window = 1000;
  std::optional<int64_t> hysteresis = 2;
  std::optional<double> min_loss_scale = 1.0;
};

struct OptimizerConfig {
  std::string type = "AdamW";
  std::optional<double> lr = 1e-3;
  std::optional<double> beta1 = 0.9;
  std::optional<double> beta2 = 0.999;
  std::optional<double> eps = 1e-8;
  std::optional<double> weight_decay = 0.01;
  // DeepSpeed's Adam parameters. Its type Adam decouples weight decay (AdamW's rule)
  // unless adam_w_mode is false; torch_adam picks torch's kernels over its fused ones,
  // the same arithmetic zeroshard's Adam follows either way; bias_correction false is
  // refused (torch's Adam always corrects).
  bool adam_w_mode = true;
  bool torch_adam = false;
  bool bias_correction = true;
  // DeepSpeed's Lamb (its FusedLamb's arithmetic, optim/LambOptimizer.h): the trust
  // ratio's clamp and where eps goes; unset: DeepSpeed's defaults (10, 0.01, false).
  // Refused with any other type.
  std::optional<double> max_coeff, min_coeff;
  std::optional<double> max_grad_norm;  // FusedLamb's own clipping: 0 only
  bool eps_inside_sqrt = false;
  // A torch.optim class (config/TorchOptimizers.h) or a client optimizer object the
  // Python package steps on the shards (optim/ExternalOptimizer.h): `type` is its class
  // name and `torch_params` the config's params for it, passed to the class as written.
  bool external = false;
  // Whether its update is elementwise, so that any part of the shards steps on its own
  // with that part's state (paged from NVMe); transformers' Adafactor's is not.
  bool elementwise = true;
  TorchOptimizerParams torch_params;
  // Bytes per trained element of the optimizer's state besides the fp32 master (Adam's
  // m and v: 8); the memory model's M_o.
  int64_t state_bytes = 8;
  // State that is not one number per trained element (transformers' Adafactor): bytes
  // every rank holds whole (a matrix's row and column statistics), and bytes per element
  // of only some parameters (a vector's second moment), in total, sharded like them.
  int64_t state_whole_bytes = 0;
  int64_t state_sharded_bytes = 0;
};

// The config's scheduler: DeepSpeed's five by their names, keys and defaults (DeepSpeed
// 0.19.8's runtime/lr_schedules.py; config/LrSchedule.h has the arithmetic). A key of
// another scheduler than `type` is refused, as DeepSpeed's class refuses the keyword. Keys
// that take "a number or a list" hold one value for every parameter group or one per
// group; an empty list means the key was left out (its default depends on `type`).
struct SchedulerConfig {
  // none | WarmupLR | WarmupDecayLR | WarmupCosineLR | OneCycle | LRRangeTest
  std::string type = "none";
  std::vector<std::string> given;  // the params keys the file set (load_config_string)
  // WarmupLR, WarmupDecayLR
  std::optional<std::vector<double>> warmup_min_lr = std::vector<double>{0.0};
  // left out: each group's lr (WarmupLR), 0.001 (WarmupDecayLR); auto: each group's lr
  std::optional<std::vector<double>> warmup_max_lr = std::vector<double>{};
  std::optional<int64_t> warmup_num_steps = 1000;
  std::optional<int64_t> total_num_steps = 0;  // 0: left out (required where it is read)
  std::string warmup_type = "log";
  // WarmupCosineLR: ratios of each group's lr
  std::optional<double> warmup_min_ratio = 0.0;
  std::optional<double> cos_min_ratio = 0.0001;
  // OneCycle (cycle_min_lr and cycle_max_lr are required)
  std::optional<std::vector<double>> cycle_min_lr = std::vector<double>{};
  std::optional<std::vector<double>> cycle_max_lr = std::vector<double>{};
  std::optional<double> decay_lr_rate = 0.0;
  std::optional<int64_t> cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size = -1;  // -1: left out, the first's
  std::optional<int64_t> cycle_first_stair_count = 0;
  std::optional<int64_t> cycle_second_stair_count = -1;  // -1: left out, the first's
  std::optional<int64_t> decay_step_size = 0;
  bool cycle_momentum = true;
  std::optional<std::vector<double>> cycle_min_mom = std::vector<double>{0.8};
  std::optional<std::vector<double>> cycle_max_mom = std::vector<double>{0.9};
  std::optional<double> decay_mom_rate = 0.0;
  // LRRangeTest
  std::optional<std::vector<double>> lr_range_test_min_lr = std::vector<double>{1e-3};
  std::optional<int64_t> lr_range_test_step_size = 2000;
  std::optional<double> lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
  // Every scheduler's: -1 only (a resumed position comes from the checkpoint).
  std::optional<int64_t> last_batch_iteration = -1;
};

struct Config {
  // Left out (or auto): derived from the other two as DeepSpeed derives it (the planner);
  // train_batch_size stays unset then, meaning micro x accumulation x ranks.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping = 0.0;  // 0 disables clipping
  bool bf16 = false;
  // The model recomputes its own blocks (Hugging Face's gradient_checkpointing_enable(), a
  // script's checkpoint calls): told to the planner.
  bool activation_checkpointing = false;
  // activation_checkpointing.mode, .selective_ac_option and .memory_budget (torchtitan's
  // names): the blocks the engine recomputes in backward (none, full, selective: every Nth
  // block or every block keeping its matmul outputs, memory_budget: as many blocks as keep
  // activations within a fraction of none's, auto: the fewest that fit the device, planned
  // per batch); plan/MemoryModel.h Recomputed counts them, _activations/policy.py applies.
  std::string activation_checkpointing_mode = "none";
  // Unset (empty, nullopt): "op" and 0.5 where their mode reads them.
  std::string selective_ac_option;
  std::optional<double> activation_memory_budget;
  ActivationOffloadConfig activation_offload;
  // torch DDP's broadcast_buffers: before a forward, rank 0's module buffers (BatchNorm's
  // running statistics) go to every rank (engine/ModuleBuffers.h says when); false keeps
  // each rank's own.
  bool broadcast_buffers = true;
  // How long a collective may wait for the other ranks before this rank gives up
  // and names the ranks that stopped answering.
  std::optional<double> comm_timeout_seconds = 300.0;
  // Before each collective the ranks agree on what it is (op, size, dtype, its number in its
  // group's order, what it is for), so that ranks whose programs part fail at once, each
  // naming every rank's collective, instead of waiting out the timeout. A small all-gather
  // per collective: for debugging and tests. ZS_CHECK_COLLECTIVES=1 turns it on too.
  bool check_collectives = false;
  // DeepSpeed's: the dataloader initialize() builds from training_data drops the last
  // partial micro-batch.
  bool dataloader_drop_last = false;
  // The dtype gradients are reduced in (DeepSpeed's key): fp32, fp16 or bf16 cast them to
  // it for the reduction. Unset (empty; null in a file): summed in fp32, each travelling
  // in its own dtype (sharding/Collectives.h).
  std::string communication_data_type;
  Fp16Config fp16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ZeroConfig zero;
  AioConfig aio;
  // Ranks each layer's matrices are split across (DeepSpeed's tensor_parallel.autotp_size;
  // the Python package sets it from a Megatron mpu): ZeRO shards over the world / tp
  // data-parallel ranks (engine/ParallelDims.h).
  std::optional<int64_t> tensor_parallel_size = 1;
  // Pipeline stages the ranks are split into (DeepSpeed's pipeline.stages, or a mesh's "pp"
  // dimension): each stage's engine shards over the ranks of its stage alone, the outermost
  // dimension (engine/ParallelDims.h).
  std::optional<int64_t> pipeline_parallel_size = 1;
  // Ranks each sequence is split across (DeepSpeed's sequence_parallel_size; Ulysses,
  // zeroshard.sequence.layer.DistributedAttention), consecutive ranks: ZeRO shards over them
  // as over data-parallel ranks and sums their gradients, as DeepSpeed does over its
  // sequence-data-parallel group; a batch is counted over the world / sp ranks that see
  // different samples, and gradients are divided by those.
  std::optional<int64_t> sequence_parallel_size = 1;
  // Those ranks split each sequence by torch's ring attention (context parallelism: a
  // mesh's cp dimension, zeroshard-estimate --cp), not by Ulysses' exchanges; no config key.
  bool ring_attention = false;
  // Ranks a mixture-of-experts layer's experts are split across (DeepSpeed's MoE layer's
  // ep_size; no config key: the Python package sets it from the model's layers), consecutive
  // data-parallel ranks; the experts' parameters are reduced and sharded over the dp / ep
  // ranks holding the same ones (engine/ParallelDims.h ep, edp).
  int64_t expert_parallel_size = 1;
  // DeepSpeed's AutoEP section (expert_parallel): a Hugging Face mixture-of-experts model's
  // experts split over autoep_size ranks when enabled; the Python package applies it
  // (bindings/zeroshard/_experts/hf_expert_parallel.py) and sets expert_parallel_size.
  struct AutoEp {
    bool enabled = false;
    std::optional<int64_t> autoep_size = 1;
    std::string preset_model;  // empty: from the model's model_type
    // A rank's experts in one grouped GEMM where torch runs it, else a loop of matmuls.
    bool use_grouped_mm = true;
  } autoep;
  // DeepSpeed's top-level data_parallel_size: where given, checked against the data-parallel
  // ranks the world leaves (world / tensor-parallel / pipeline / sequence-parallel); it
  // splits nothing itself.
  std::optional<int64_t> data_parallel_size;
  WeightQuantization weight_quantization;

  // Bytes per low-precision value: 2 with bf16 or fp16, 4 in fp32 training.
  int compute_bytes() const { return (bf16 || fp16.enabled) ? 2 : 4; }
};

// What loading a file found besides the Config: keys DeepSpeed knows that
// zeroshard accepts and ignores, each with a one-line reason.
struct LoadedConfig {
  Config config;
  std::string origin;  // the file's path, or what the text came from ("config dict")
  std::vector<std::string> warnings;
  std::vector<std::string> top_level_keys;  // as written (e.g. whether "optimizer" was given)
};

LoadedConfig load_config_file(const std::string& path);
LoadedConfig load_config_string(const std::string& yaml_text, const std::string& origin);

// Checks that hold between keys (e.g. offload_param needs stage 3); throws Error.
void check_contradictions(const Config& config);

// What rules zero_optimization.offload_optimizer.overlap_step out for `config`
// (optim/OverlappedStep.h says why each does), or nothing. A key still auto (stage, an
// offload device) rules nothing out yet: the Planner asks again once it is resolved.
struct OverlapStepObstacle {
  std::string setting;  // the key and its value, e.g. "'gradient_clipping' 1"
  std::string allowed;  // what would allow the overlap
  std::string why;      // one line, e.g. for the Planner's reasons
};
std::optional<OverlapStepObstacle> overlap_step_obstacle(const Config& config);

// The YAML text of `config`, every knob written out; load_config_string accepts it.
std::string emit_config_yaml(const Config& config);

}  // namespace zeroshard
