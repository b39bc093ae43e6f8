#include "config/ConfigSchema.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace zeroshard {
namespace {

constexpr double kBig = 1e15;
constexpr double kInf = std::numeric_limits<double>::infinity();

using IntRef = std::function<std::optional<int64_t>&(Config&)>;
using FloatRef = std::function<std::optional<double>&(Config&)>;

// What every knob has: its path in the config and its type.
Knob base_knob(std::string path, Knob::Type type) {
  Knob k;
  k.path = std::move(path);
  k.type = type;
  return k;
}

Knob int_knob(std::string path, double min, double max, IntRef ref, int64_t multiple_of = 1) {
  Knob k = base_knob(std::move(path), Knob::Type::Int);
  k.min = min;
  k.max = max;
  k.multiple_of = multiple_of;
  k.as_int = std::move(ref);
  return k;
}

Knob float_knob(std::string path, double min, double max, FloatRef ref,
                bool min_exclusive = false) {
  Knob k = base_knob(std::move(path), Knob::Type::Float);
  k.min = min;
  k.max = max;
  k.min_exclusive = min_exclusive;
  k.as_float = std::move(ref);
  return k;
}

Knob floats_knob(std::string path, double min, double max,
                 std::function<std::optional<std::vector<double>>&(Config&)> ref,
                 bool auto_ok = false) {
  Knob k = base_knob(std::move(path), Knob::Type::FloatList);
  k.min = min;
  k.max = max;
  k.auto_ok = auto_ok;
  k.as_floats = std::move(ref);
  return k;
}

Knob bool_knob(std::string path, std::function<bool&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Bool);
  k.auto_ok = false;
  k.as_bool = std::move(ref);
  return k;
}

Knob choice_knob(std::string path, std::vector<std::string> choices,
                 std::function<std::string&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Choice);
  k.auto_ok = false;
  k.choices = std::move(choices);
  k.as_text = std::move(ref);
  return k;
}

Knob text_knob(std::string path, std::function<std::string&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Text);
  k.auto_ok = false;
  k.as_text = std::move(ref);
  return k;
}

Knob offload_knob(std::string path, std::function<OffloadDevice&(Config&)> ref) {
  Knob k = base_knob(std::move(path), Knob::Type::Offload);
  k.choices = {"none", "cpu", "nvme"};
  k.as_offload = std::move(ref);
  return k;
}

// zeroshard's own Adam, AdamW and Lamb, then the torch.optim classes it steps.
std::vector<std::string> optimizer_types() {
  std::vector<std::string> types{"AdamW", "Adam", "Lamb"};
  for (const auto& t : torch_optimizer_types()) types.push_back(t);
  return types;
}

std::vector<Knob> build_knobs() {
  const std::string z = "zero_optimization.";
  const std::string oo = z + "offload_optimizer.";
  const std::string sp = "scheduler.params.";
  const std::string wq = "weight_quantization.quantized_initialization.";
  auto fixed = [](Knob k) {  // no auto: DeepSpeed's default stands where the key is left out
    k.auto_ok = false;
    return k;
  };
  const std::string op = z + "offload_param.";
  Knob betas;
  betas.path = "optimizer.params.betas";
  betas.type = Knob::Type::Betas;
  betas.min = 0;
  betas.max = 1;
  betas.as_betas = [](Config& c) { return std::make_pair(&c.optimizer.beta1, &c.optimizer.beta2); };
  // clang-format off
  return {
    int_knob("train_batch_size", 1, kBig, [](Config& c) -> auto& { return c.train_batch_size; }),
    int_knob("train_micro_batch_size_per_gpu", 1, kBig, [](Config& c) -> auto& { return c.train_micro_batch_size_per_gpu; }),
    int_knob("gradient_accumulation_steps", 1, kBig, [](Config& c) -> auto& { return c.gradient_accumulation_steps; }),
    float_knob("gradient_clipping", 0, kInf, [](Config& c) -> auto& { return c.gradient_clipping; }),
    float_knob("comm_timeout_seconds", 0, kInf, [](Config& c) -> auto& { return c.comm_timeout_seconds; }, true),
    choice_knob("communication_data_type", {"fp32", "fp16", "bf16"}, [](Config& c) -> auto& { return c.communication_data_type; }),
    bool_knob("bf16.enabled", [](Config& c) -> auto& { return c.bf16; }),
    bool_knob("fp16.enabled", [](Config& c) -> auto& { return c.fp16.enabled; }),
    float_knob("fp16.loss_scale", 0, kInf, [](Config& c) -> auto& { return c.fp16.loss_scale; }),
    int_knob("fp16.initial_scale_power", 0, 64, [](Config& c) -> auto& { return c.fp16.initial_scale_power; }),
    int_knob("fp16.loss_scale_window", 1, kBig, [](Config& c) -> auto& { return c.fp16.loss_scale_window; }),
    int_knob("fp16.hysteresis", 1, kBig, [](Config& c) -> auto& { return c.fp16.hysteresis; }),
    float_knob("fp16.min_loss_scale", 0, kInf, [](Config& c) -> auto& { return c.fp16.min_loss_scale; }, true),
    choice_knob("optimizer.type", optimizer_types(), [](Config& c) -> auto& { return c.optimizer.type; }),
    float_knob("optimizer.params.lr", 0, kInf, [](Config& c) -> auto& { return c.optimizer.lr; }),
    betas,
    float_knob("optimizer.params.eps", 0, 1, [](Config& c) -> auto& { return c.optimizer.eps; }, true),
    float_knob("optimizer.params.weight_decay", 0, kInf, [](Config& c) -> auto& { return c.optimizer.weight_decay; }),
    bool_knob("optimizer.params.adam_w_mode", [](Config& c) -> auto& { return c.optimizer.adam_w_mode; }),
    bool_knob("optimizer.params.torch_adam", [](Config& c) -> auto& { return c.optimizer.torch_adam; }),
    bool_knob("optimizer.params.bias_correction", [](Config& c) -> auto& { return c.optimizer.bias_correction; }),
    float_knob("optimizer.params.max_coeff", 0, kInf, [](Config& c) -> auto& { return c.optimizer.max_coeff; }),
    float_knob("optimizer.params.min_coeff", 0, kInf, [](Config& c) -> auto& { return c.optimizer.min_coeff; }),
    float_knob("optimizer.params.max_grad_norm", 0, kInf, [](Config& c) -> auto& { return c.optimizer.max_grad_norm; }),
    bool_knob("optimizer.params.eps_inside_sqrt", [](Config& c) -> auto& { return c.optimizer.eps_inside_sqrt; }),
    choice_knob("scheduler.type", {"none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"}, [](Config& c) -> auto& { return c.scheduler.type; }),
    floats_knob(sp + "warmup_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.warmup_min_lr; }, true),
    floats_knob(sp + "warmup_max_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.warmup_max_lr; }, true),
    int_knob(sp + "warmup_num_steps", 1, kBig, [](Config& c) -> auto& { return c.scheduler.warmup_num_steps; }),
    int_knob(sp + "total_num_steps", 1, kBig, [](Config& c) -> auto& { return c.scheduler.total_num_steps; }),
    choice_knob(sp + "warmup_type", {"log", "linear"}, [](Config& c) -> auto& { return c.scheduler.warmup_type; }),
    fixed(float_knob(sp + "warmup_min_ratio", 0, 1, [](Config& c) -> auto& { return c.scheduler.warmup_min_ratio; })),
    fixed(float_knob(sp + "cos_min_ratio", 0, 1, [](Config& c) -> auto& { return c.scheduler.cos_min_ratio; })),
    floats_knob(sp + "cycle_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.cycle_min_lr; }),
    floats_knob(sp + "cycle_max_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.cycle_max_lr; }),
    fixed(float_knob(sp + "decay_lr_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.decay_lr_rate; })),
    fixed(int_knob(sp + "cycle_first_step_size", 1, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_first_step_size; })),
    fixed(int_knob(sp + "cycle_second_step_size", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_second_step_size; })),
    fixed(int_knob(sp + "cycle_first_stair_count", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_first_stair_count; })),
    fixed(int_knob(sp + "cycle_second_stair_count", 0, kBig, [](Config& c) -> auto& { return c.scheduler.cycle_second_stair_count; })),
    fixed(int_knob(sp + "decay_step_size", 0, kBig, [](Config& c) -> auto& { return c.scheduler.decay_step_size; })),
    bool_knob(sp + "cycle_momentum", [](Config& c) -> auto& { return c.scheduler.cycle_momentum; }),
    floats_knob(sp + "cycle_min_mom", 0, 1, [](Config& c) -> auto& { return c.scheduler.cycle_min_mom; }),
    floats_knob(sp + "cycle_max_mom", 0, 1, [](Config& c) -> auto& { return c.scheduler.cycle_max_mom; }),
    fixed(float_knob(sp + "decay_mom_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.decay_mom_rate; })),
    floats_knob(sp + "lr_range_test_min_lr", 0, kInf, [](Config& c) -> auto& { return c.scheduler.lr_range_test_min_lr; }),
    fixed(int_knob(sp + "lr_range_test_step_size", 1, kBig, [](Config& c) -> auto& { return c.scheduler.lr_range_test_step_size; })),
    fixed(float_knob(sp + "lr_range_test_step_rate", 0, kInf, [](Config& c) -> auto& { return c.scheduler.lr_range_test_step_rate; })),
    bool_knob(sp + "lr_range_test_staircase", [](Config& c) -> auto& { return c.scheduler.lr_range_test_staircase; }),
    fixed(int_knob(sp + "last_batch_iteration", -1, -1, [](Config& c) -> auto& { return c.scheduler.last_batch_iteration; })),
    bool_knob("activation_checkpointing.enabled", [](Config& c) -> auto& { return c.activation_checkpointing; }),
    bool_knob("broadcast_buffers", [](Config& c) -> auto& { return c.broadcast_buffers; }),
    bool_knob("check_collectives", [](Config& c) -> auto& { return c.check_collectives; }),
    bool_knob("dataloader_drop_last", [](Config& c) -> auto& { return c.dataloader_drop_last; }),
    int_knob(z + "stage", 0, 3, [](Config& c) -> auto& { return c.zero.stage; }),
    bool_knob(z + "overlap_comm", [](Config& c) -> auto& { return c.zero.overlap_comm; }),
    bool_knob(z + "contiguous_gradients", [](Config& c) -> auto& { return c.zero.contiguous_gradients; }),
    int_knob(z + "reduce_bucket_size", 1, kBig, [](Config& c) -> auto& { return c.zero.reduce_bucket_size; }),
    int_knob(z + "allgather_bucket_size", 1, kBig, [](Config& c) -> auto& { return c.zero.allgather_bucket_size; }),
    int_knob(z + "stage3_prefetch_bucket_size", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_prefetch_bucket_size; }),
    int_knob(z + "stage3_max_live_parameters", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_max_live_parameters; }),
    int_knob(z + "stage3_param_persistence_threshold", 0, kBig, [](Config& c) -> auto& { return c.zero.stage3_param_persistence_threshold; }),
    int_knob(z + "sub_group_size", 1, kBig, [](Config& c) -> auto& { return c.zero.sub_group_size; }),
    int_knob(z + "mics_shard_size", -1, kBig, [](Config& c) -> auto& { return c.zero.mics_shard_size; }),
    fixed(int_knob("tensor_parallel.autotp_size", 1, kBig, [](Config& c) -> auto& { return c.tensor_parallel_size; })),
    fixed(int_knob("pipeline.stages", 1, kBig, [](Config& c) -> auto& { return c.pipeline_parallel_size; })),
    fixed(int_knob("data_parallel_size", 1, kBig, [](Config& c) -> auto& { return c.data_parallel_size; })),
    fixed(int_knob(wq + "num_bits", 0, 8, [](Config& c) -> auto& { return c.weight_quantization.num_bits; })),
    fixed(int_knob(wq + "group_size", 1, kBig, [](Config& c) -> auto& { return c.weight_quantization.group_size; })),
    fixed(int_knob(wq + "group_dim", 0, 1, [](Config& c) -> auto& { return c.weight_quantization.group_dim; })),
    bool_knob(wq + "symmetric", [](Config& c) -> auto& { return c.weight_quantization.symmetric; }),
    int_knob(z + "zero_hpz_partition_size", 1, kBig, [](Config& c) -> auto& { return c.zero.hpz_partition_size; }),
    offload_knob(oo + "device", [](Config& c) -> auto& { return c.zero.offload_optimizer.device; }),
    text_knob(oo + "nvme_path", [](Config& c) -> auto& { return c.zero.offload_optimizer.nvme_path; }),
    bool_knob(oo + "pin_memory", [](Config& c) -> auto& { return c.zero.offload_optimizer.pin_memory; }),
    int_knob(oo + "buffer_count", 1, 1024, [](Config& c) -> auto& { return c.zero.offload_optimizer.buffer_count; }),
    choice_knob(oo + "overlap_step", {"auto", "true", "false"}, [](Config& c) -> auto& { return c.zero.offload_optimizer.overlap_step; }),
    float_knob(oo + "ratio", 0, 1, [](Config& c) -> auto& { return c.zero.offload_optimizer.ratio; }),
    offload_knob(op + "device", [](Config& c) -> auto& { return c.zero.offload_param.device; }),
    text_knob(op + "nvme_path", [](Config& c) -> auto& { return c.zero.offload_param.nvme_path; }),
    bool_knob(op + "pin_memory", [](Config& c) -> auto& { return c.zero.offload_param.pin_memory; }),
    int_knob(op + "buffer_count", 1, 1024, [](Config& c) -> auto& { return c.zero.offload_param.buffer_count; }),
    int_knob(op + "max_in_cpu", 0, kBig, [](Config& c) -> auto& { return c.zero.offload_param.max_in_cpu; }),
    int_knob("aio.block_size", 4096, 1 << 30, [](Config& c) -> auto& { return c.aio.block_size; }, 4096),
    int_knob("aio.queue_depth", 1, 4096, [](Config& c) -> auto& { return c.aio.queue_depth; }),
    int_knob("aio.intra_op_parallelism", 1, 256, [](Config& c) -> auto& { return c.aio.intra_op_parallelism; }),
    bool_knob("aio.single_submit", [](Config& c) -> auto& { return c.aio.single_submit; }),
    bool_knob("aio.overlap_events", [](Config& c) -> auto& { return c.aio.overlap_events; }),
  };
  // clang-format on
}

const std::map<std::string, const char*>& ignored_keys() {
  static const auto* keys = new std::map<std::string, const char*>{
      {"steps_per_print", "zeroshard logs through its own reports"},
      {"memory_breakdown", "engine.memory_report() shows memory by tier and kind"},
      {"zero_force_ds_cpu_optimizer", "an offloaded Adam is zeroshard's own CPU Adam"},
      {"seq_parallel_communication_data_type", "there is no sequence parallelism here"},
      {"checkpoint.tag_validation", "a checkpoint's tag is checked against its manifest"},
      {"checkpoint.use_node_local_storage", "every rank writes its own file"},
      {"bf16.immediate_grad_update", "reduced gradients land in fp32 as they arrive"},
      {"wall_clock_breakdown", "timings come from tools/ benchmarks"},
      {"dump_state", "engine.memory_report() shows the state"},
      {"cuda_visible_devices",
       "not a DeepSpeed key either; the launcher's CUDA_VISIBLE_DEVICES picks the GPUs"},
      {"prescale_gradients",
       "gradients are summed in communication_data_type (DeepSpeed's default: the training "
       "precision), "
       "then averaged in fp32"},
      {"gradient_predivide_factor",
       "gradients are summed in communication_data_type (DeepSpeed's default: the training "
       "precision), "
       "then averaged in fp32"},
      {"zero_allow_untested_optimizer", "every optimizer zeroshard offers is tested"},
      {"flops_profiler", "not implemented"},
      {"tensorboard", "not implemented"},
      {"wandb", "not implemented"},
      {"csv_monitor", "not implemented"},
      {"comms_logger", "not implemented"},
      {"comet", "not implemented"},
      {"timers", "zeroshard logs through its own reports"},
      {"log_level", "zeroshard logs through its own reports"},
      {"zero_optimization.log_trace_cache_warnings", "no trace cache is kept"},
      {"allgather_size", "all-gathers are sized by zero_optimization.allgather_bucket_size"},
      {"vocabulary_size", "read by DeepSpeed's data efficiency library only"},
      {"zero_optimization.use_multi_rank_bucket_allreduce",
       "gradients are reduce-scattered over the data-parallel group"},
      {"zero_optimization.offload_optimizer.cpuadam_cores_perc",
       "CPU Adam runs on the rank's threads (OMP_NUM_THREADS)"},
      {"optimizer.legacy_fusion", "not needed"},
      {"optimizer.params.foreach", "the sharded Adam runs its own kernel"},
      {"optimizer.params.set_grad_none", "gradients live in the engine's buffers"},
      {"checkpoint.checkpoint_serialization", "zeroshard writes its own checkpoint format"},
      {"tensor_parallel.dtype", "the dtype comes from bf16 or fp16"},
      {"fp16.auto_cast", "autocast is left to the model"},
      {"fp16.consecutive_hysteresis", "hysteresis counts every overflow"},
      {"zero_optimization.round_robin_gradients", "buckets are reduced in a fixed order"},
      {"zero_optimization.reduce_scatter", "reduce-scatter is always used from stage 2"},
      {"zero_optimization.allgather_partitions", "all-gather is always used"},
      {"zero_optimization.elastic_checkpoint", "checkpoints reshard on load"},
      {"zero_optimization.ignore_unused_parameters", "unused parameters count as zero"},
      {"zero_optimization.load_from_fp32_weights", "checkpoints load fp32 masters"},
      {"zero_optimization.memory_efficient_linear", "not needed"},
      {"zero_optimization.mics_hierarchical_params_gather",
       "a gather stays inside its mics_shard_size group already"},
      {"zero_optimization.stage3_max_reuse_distance", "the prefetch budget bounds reuse"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
       "engine.save_16bit_model gathers at every stage"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
       "engine.save_16bit_model gathers at every stage"},
      {"zero_optimization.offload_param.buffer_size", "buffers are sized from the largest unit"},
      {"zero_optimization.offload_optimizer.fast_init", "not needed"},
      {"zero_optimization.offload_optimizer.pipeline_read", "the Swapper always pipelines"},
      {"zero_optimization.offload_optimizer.pipeline_write", "the Swapper always pipelines"},
      {"pipeline.partition",
       "each rank's stage is the module it gives to initialize (torch.distributed.pipelining)"},
      {"pipeline.pipe_partitioned", "activations cross stages whole (torch's pipelining P2P)"},
      {"pipeline.grad_partitioned", "gradients cross stages whole (torch's pipelining P2P)"},
      {"pipeline.use_reentrant",
       "read by zeroshard.pipe.PipelineModule; a torch pipelining stage checkpoints in its own "
       "modules"},
      {"activation_checkpointing.partition_activations", "not implemented"},
      {"activation_checkpointing.cpu_checkpointing", "not implemented"},
      {"activation_checkpointing.contiguous_memory_optimization", "not implemented"},
      {"activation_checkpointing.number_checkpoints", "not implemented"},
      {"activation_checkpointing.synchronize_checkpoint_boundary", "not implemented"},
      {"activation_checkpointing.profile", "not implemented"},
  };
  return *keys;
}

const std::map<std::string, LackedFeature>& lacked_features() {
  static const auto* features = new std::map<std::string, LackedFeature>{
      {"amp", {nullptr, "apex AMP is not used here; set bf16.enabled or fp16.enabled"}},
      {"torch_autocast", {nullptr, "set bf16.enabled or fp16.enabled"}},
      {"elasticity",
       {nullptr,
        "elastic batch sizes are not supported; fix train_batch_size (checkpoints "
        "reshard to any world size)"}},
      {"curriculum_learning", {nullptr, "data scheduling is left to the script's data loader"}},
      {"data_efficiency", {nullptr, "data scheduling is left to the script's data loader"}},
      {"compression_training", {nullptr, "model compression is not supported"}},
      {"progressive_layer_drop",
       {nullptr, "layers are not dropped; every step runs the whole model"}},
      {"sparse_attention",
       {nullptr, "the model's own attention runs; DeepSpeed's block-sparse kernels are not here",
        /*present_is_on=*/true}},
      {"autotuning",
       {nullptr, "zeroshard-estimate (./zs estimate) plans the config before launch"}},
      {"pipeline.activation_checkpoint_interval",
       {"0",
        "a zeroshard.pipe.PipelineModule reads it; a torch pipelining stage checkpoints in its "
        "own modules (torch.utils.checkpoint)"}},
      {"pipeline.seed_layers", {"false", "each stage's module is built by the script"}},
      {"sequence_parallel_size",
       {"1", "sequence parallelism is not supported yet; each rank holds the whole sequence"}},
      {"sparse_gradients", {"false", "sparse gradients are not supported; gradients are dense"}},
      {"checkpoint.load_universal",
       {"false",
        "DeepSpeed's universal checkpoints are not read; zeroshard's own reshard on load"}},
      {"data_types.grad_accum_dtype", {"fp32", "gradients accumulate in fp32"}},
      {"fp16.fp16_master_weights_and_grads", {"false", "master weights and gradients are fp32"}},
      {"zero_optimization.cpu_offload",
       {"false",
        "it is DeepSpeed's old key; write zero_optimization.offload_optimizer.device: cpu"}},
      {"zero_optimization.zero_quantized_weights",
       {"false", "ZeRO++ quantized communication is not supported; zero_hpz_partition_size is"}},
      {"zero_optimization.zero_quantized_gradients",
       {"false", "ZeRO++ quantized communication is not supported; zero_hpz_partition_size is"}},
      {"zero_optimization.zero_quantized_nontrainable_weights",
       {"false", "ZeRO++ quantized communication is not supported; zero_hpz_partition_size is"}},
      // DeepSpeed 0.19.8's other keys: each loads at DeepSpeed's default and is refused by
      // name where it asks for what zeroshard does not do.
      {"managed_gradient_accumulation",
       {"true", "the engine accumulates gradients over gradient_accumulation_steps itself"}},
      {"disable_python_gc", {"false", "Python's garbage collector is left as it is"}},
      {"disable_allgather", {"false", "stage 1-2 updates are all-gathered"}},
      {"gradient_allreduce_op", {"mean", "gradients are averaged over the data-parallel ranks"}},
      {"use_data_before_expert_parallelism", {"false", "expert parallelism is not supported yet"}},
      {"datastates_ckpt",
       {"false",
        "DataStates checkpointing is not supported; checkpoints go through "
        "zeroshard's io engine"}},
      {"graph_harvesting", {"false", "CUDA graphs are not captured"}},
      {"nebula", {nullptr, "Nebula checkpointing is not supported"}},
      {"quantize_training", {nullptr, "quantization-aware training is not supported"}},
      {"eigenvalue", {nullptr, "eigenvalue-based quantization scheduling is not supported"}},
      {"hybrid_engine", {nullptr, "DeepSpeed-Chat's hybrid engine is not supported"}},
      {"expert_parallel",
       {nullptr,
        "expert parallelism (AutoEP) is not supported yet; a mixture-of-experts "
        "model's experts are sharded as any module is"}},
      {"zero_optimization.zeropp_loco_param",
       {nullptr, "ZeRO++ LoCo is not supported", /*present_is_on=*/true}},
      {"zero_optimization.zenflow",
       {nullptr, "ZenFlow is not supported; offload_optimizer.overlap_step overlaps the CPU step",
        /*present_is_on=*/true}},
      {"zero_optimization.leaf_module",
       {nullptr, "ZeRO-3 leaf modules are given as initialize(units=[...])",
        /*present_is_on=*/true}},
      {"zero_optimization.stage3_model_persistence_threshold",
       {"9223372036854775807",
        "no model-wide cap on the parameters kept whole; stage3_param_persistence_threshold "
        "chooses them"}},
      {"zero_optimization.compute_grad_norm",
       {"true", "the engine computes the global gradient norm every step"}},
      {"zero_optimization.cpu_offload_param",
       {"false", "it is DeepSpeed's old key; write zero_optimization.offload_param.device: cpu"}},
      {"zero_optimization.cpu_offload_use_pin_memory",
       {"false", "it is DeepSpeed's old key; write offload_param.pin_memory"}},
      {"zero_optimization.legacy_stage1", {"false", "DeepSpeed's legacy stage 1 is not here"}},
      {"zero_optimization.parameter_alignment", {"false", "shards are aligned for direct I/O"}},
      {"zero_optimization.pipeline_loading_checkpoint",
       {"false", "pipelined checkpoint loading is not supported"}},
      {"zero_optimization.override_module_apply",
       {"true", "zeroshard.init gathers what module.apply touches"}},
      {"zero_optimization.enable_sanity_checks", {"false", "not supported"}},
      {"zero_optimization.save_muon_momentum_buffer_in_memory",
       {"false", "the Muon optimizer is not supported"}},
      {"zero_optimization.module_granularity_threshold",
       {"0", "stage-3 units are given as initialize(units=[...])"}},
      {"zero_optimization.use_all_reduce_for_fetch_params",
       {"false", "stage 3 fetches parameters with all-gathers"}},
      {"zero_optimization.allgather_sequential",
       {"false", "a unit's parameters are gathered in one all-gather"}},
      {"zero_optimization.offload_optimizer.super_offload",
       {"false", "SuperOffload is not supported"}},
      {"bf16.check_grad_overflow",
       {"true",
        "a window whose gradients are not finite is always skipped, as DeepSpeed's "
        "default does"}},
      {"bf16.bf16_master_weights_and_grads", {"false", "master weights and gradients are fp32"}},
      {"bf16.bf16_optimizer_states", {"false", "optimizer states are fp32"}},
      {"optimizer.params.amsgrad", {"false", "AMSGrad is not supported"}},
      {"optimizer.params.fp32_optimizer_states", {"true", "Adam's moments are fp32"}},
      {"aio.use_gds",
       {"false", "GPUDirect Storage is not used; the io engine reads into pinned host memory"}},
      {"checkpoint.parallel_write",
       {nullptr, "checkpoints are written by every rank through zeroshard's io engine",
        /*present_is_on=*/true}},
      {"checkpoint.writer",
       {nullptr, "DeepSpeed's FastFileWriter; checkpoints go through zeroshard's io engine",
        /*present_is_on=*/true}},
      {"data_types.param_dtype",
       {nullptr, "parameters train in bf16 or fp16 as those sections say", true}},
      {"data_types.buffer_dtype", {nullptr, "buffers keep the model's dtype", true}},
      {"data_types.keep_in_fp32_modules", {"auto", "modules are kept in the training dtype"}},
      {"tensor_parallel.tp_overlap_comm",
       {"false", "tensor-parallel collectives are not overlapped"}},
      {"tensor_parallel.vocab_parallel_lm_head",
       {"false", "the head is split as the model's tp_plan says"}},
      {"tensor_parallel.vocab_parallel_ce_backend", {"torch", "the loss is torch's"}},
      {"tensor_parallel.tp",
       {nullptr, "DeepSpeed's inference tp section; write tensor_parallel.autotp_size", true}},
      {"tensor_parallel.tensor_parallel",
       {nullptr, "DeepSpeed's inference tp section; write tensor_parallel.autotp_size", true}},
      {"tensor_parallel.injection_policy_tuple",
       {nullptr, "the model is split by its own tp_plan", true}},
      {"tensor_parallel.partition_config",
       {nullptr, "the model is split by its own tp_plan", true}},
      {"tensor_parallel.preset_model", {nullptr, "the model is split by its own tp_plan", true}},
      {"tensor_parallel.keep_module_on_host", {"false", "split modules stay where the model is"}},
      {"tensor_parallel.replace_with_kernel_inject", {"false", "no kernels are injected"}},
      {"tensor_parallel.kernel_inject", {"false", "no kernels are injected"}},
      {"weight_quantization.enabled", {"true", "DeepSpeed's inference quantization keys"}},
      {"weight_quantization.num_bits", {"8", "DeepSpeed's inference quantization keys"}},
      {"weight_quantization.q_type", {"symmetric", "DeepSpeed's inference quantization keys"}},
      {"weight_quantization.q_groups", {"1", "DeepSpeed's inference quantization keys"}},
      {"weight_quantization.post_init_quant",
       {nullptr,
        "post-init quantization is not supported; weight_quantization."
        "quantized_initialization is",
        true}},
      {"compile.deepcompile", {"false", "DeepCompile is not supported; torch.compile the model"}},
      {"compile.autoep_non_moe", {"false", "read by DeepCompile only"}},
      {"compile.free_activation", {"false", "read by DeepCompile only"}},
      {"compile.free_activation_threshold", {"10485760", "read by DeepCompile only"}},
      {"compile.offload_activation", {"false", "read by DeepCompile only"}},
      {"compile.offload_activation_pin_memory", {"true", "read by DeepCompile only"}},
      {"compile.offload_opt_states", {"false", "read by DeepCompile only"}},
      {"compile.double_buffer", {"true", "read by DeepCompile only"}},
      {"compile.symmetric_memory", {"false", "read by DeepCompile only"}},
      {"compile.debug_log", {"false", "read by DeepCompile only"}},
      {"compile.offload_parameters", {"false", "read by DeepCompile only"}},
      {"compile.sync_before_reduce", {"false", "read by DeepCompile only"}},
      {"compile.sync_after_reduce", {"false", "read by DeepCompile only"}},
      {"compile.sync_before_allgather", {"false", "read by DeepCompile only"}},
      {"compile.sync_after_allgather", {"false", "read by DeepCompile only"}},
      {"compile.keep_int_input_tensors", {"true", "read by DeepCompile only"}},
      {"compile.keep_all_input_tensors", {"false", "read by DeepCompile only"}},
      {"compile.passes", {nullptr, "DeepCompile is not supported", true}},
  };
  return *features;
}

std::string number_text(double v) {
  if (v >= kBig) return "inf";
  return fmt::format("{}", v);
}

}  // namespace

std::string Knob::allowed() const {
  const std::string auto_text = auto_ok ? " or auto" : "";
  switch (type) {
    case Type::Bool:
      return "true or false";
    case Type::Int: {
      std::string text = fmt::format("integer {}..{}", number_text(min), number_text(max));
      if (multiple_of > 1) text += fmt::format(", a multiple of {}", multiple_of);
      return text + auto_text;
    }
    case Type::Float:
      return fmt::format("number {}{}..{}{}", min_exclusive ? ">" : "", number_text(min),
                         number_text(max), auto_text);
    case Type::FloatList:
      return fmt::format("a number {}..{}, or a list of them (one per parameter group){}",
                         number_text(min), number_text(max), auto_text);
    case Type::Betas:
      return "a list of two numbers in [0, 1), e.g. [0.9, 0.999], or auto";
    case Type::Choice:
      return fmt::format("one of {}", fmt::join(choices, ", "));
    case Type::Text:
      return "a string";
    case Type::Offload:
      return "one of none, cpu, nvme or auto";
  }
  return "";
}

const std::vector<Knob>& config_knobs() {
  static const auto* knobs = new std::vector<Knob>(build_knobs());
  return *knobs;
}

const Knob* find_knob(const std::string& path) {
  for (const auto& knob : config_knobs()) {
    if (knob.path == path) return &knob;
  }
  return nullptr;
}

const char* ignored_key_reason(const std::string& path) {
  const auto& keys = ignored_keys();
  const auto it = keys.find(path);
  return it == keys.end() ? nullptr : it->second;
}

const LackedFeature* lacked_feature(const std::string& path) {
  const auto& features = lacked_features();
  const auto it = features.find(path);
  return it == features.end() ? nullptr : &it->second;
}

std::string current_key_name(const std::string& path) {
  // DeepSpeed takes both names of each (its schema's field and its alias).
  static const auto* names = new std::map<std::string, std::string>{
      {"aio.thread_count", "aio.intra_op_parallelism"},
      {"bfloat16", "bf16"},
      {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"},
      {"zero_optimization.param_persistence_threshold",
       "zero_optimization.stage3_param_persistence_threshold"},
      {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"},
      {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance"},
      {"zero_optimization.gather_16bit_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {"zero_optimization.model_persistence_threshold",
       "zero_optimization.stage3_model_persistence_threshold"},
      {"zero_optimization.stage3_module_granularity_threshold",
       "zero_optimization.module_granularity_threshold"},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params",
       "zero_optimization.use_all_reduce_for_fetch_params"},
      {"zero_optimization.stage3_allgather_sequential", "zero_optimization.allgather_sequential"},
  };
  const auto it = names->find(path);
  return it == names->end() ? path : it->second;
}

bool is_config_section(const std::string& path) {
  if (path.empty()) return true;
  auto under = [&](const std::string& key) {
    return key.compare(0, path.size() + 1, path + ".") == 0;
  };
  return std::any_of(config_knobs().begin(), config_knobs().end(),
                     [&](const Knob& k) { return under(k.path); }) ||
         std::any_of(ignored_keys().begin(), ignored_keys().end(),
                     [&](const auto& e) { return under(e.first); }) ||
         std::any_of(lacked_features().begin(), lacked_features().end(),
                     [&](const auto& e) { return under(e.first); });
}

std::vector<std::string> section_children(const std::string& section) {
  std::vector<std::string> children;
  auto add = [&](const std::string& path) {
    if (section.empty() ? true : path.compare(0, section.size() + 1, section + ".") == 0) {
      const std::string rest = section.empty() ? path : path.substr(section.size() + 1);
      const std::string child = rest.substr(0, rest.find('.'));
      if (std::find(children.begin(), children.end(), child) == children.end())
        children.push_back(child);
    }
  };
  for (const auto& knob : config_knobs()) add(knob.path);
  for (const auto& entry : ignored_keys()) add(entry.first);
  for (const auto& entry : lacked_features()) add(entry.first);
  return children;
}

}  // namespace zeroshard
