// DeepSpeed's keys that are no knob of zeroshard's: the ones accepted and ignored, the
// features zeroshard lacks (accepted while left off), and the keys DeepSpeed takes under
// two names.
#include <map>
#include <string>

#include "config/ConfigSchema.h"

namespace zeroshard {

const std::map<std::string, const char*>& ignored_keys() {
  static const auto* keys = new std::map<std::string, const char*>{
      {"steps_per_print", "zeroshard logs through its own reports"},
      {"memory_breakdown", "engine.memory_report() shows memory by tier and kind"},
      {"zero_force_ds_cpu_optimizer", "an offloaded Adam is zeroshard's own CPU Adam"},
      {"seq_parallel_communication_data_type",
       "the sequence-parallel all-to-alls run in the activations' own dtype"},
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
      {"use_data_before_expert_parallelism",
       {"false",
        "expert-parallel groups are DeepSpeed's default layout (consecutive ranks), the "
        "expert-data-parallel ones across them"}},
      {"datastates_ckpt",
       {"false",
        "DataStates checkpointing is not supported; checkpoints go through "
        "zeroshard's io engine"}},
      {"graph_harvesting", {"false", "CUDA graphs are not captured"}},
      {"nebula", {nullptr, "Nebula checkpointing is not supported"}},
      {"quantize_training", {nullptr, "quantization-aware training is not supported"}},
      {"eigenvalue", {nullptr, "eigenvalue-based quantization scheduling is not supported"}},
      {"hybrid_engine", {nullptr, "DeepSpeed-Chat's hybrid engine is not supported"}},
      // AutoEP's other keys, at DeepSpeed's defaults: how its kernels route and combine.
      {"expert_parallel.expert_tensor_parallel_size",
       {"1", "experts are not split across tensor-parallel ranks"}},
      {"expert_parallel.validate_folding_routing", {"false", "there is no AutoTP folding"}},
      {"expert_parallel.async_split_plan", {"false", "the all-to-all's split is planned in step"}},
      {"expert_parallel.disable_triton_grouped_mm", {"false", "no Triton kernel is used"}},
      {"expert_parallel.route_scale",
       {"1.0", "the model's router weights are used as it makes them"}},
      {"expert_parallel.score_apply", {"auto", "weights apply where the model applies them"}},
      {"expert_parallel.combine_impl", {"auto", "outputs combine as the model combines them"}},
      {"expert_parallel.row_weighting_impl", {"auto", "rows weigh as the model weighs them"}},
      {"expert_parallel.gate_up_impl", {"separate", "the model's own gate and up projections"}},
      {"expert_parallel.comm_backend", {"comm", "the all-to-all goes through torch.distributed"}},
      {"expert_parallel.comm_num_sm", {"12", "DeepEP is not used"}},
      {"expert_parallel.comm_qp_margin", {"4", "DeepEP is not used"}},
      {"expert_parallel.comm_max_tokens_per_rank", {"0", "DeepEP is not used"}},
      {"expert_parallel.score_func", {"auto", "the model's router scores"}},
      {"expert_parallel.top_k", {"auto", "the model's config's top k"}},
      {"expert_parallel.routed_scaling_factor", {"auto", "the model's config's factor"}},
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

const std::map<std::string, const char*>& python_keys() {
  // Where the Python package reads each one; a LibTorch program's modules do their own
  // checkpointing.
  static const char* checkpointing =
      "read by the Python package's zeroshard.checkpointing (deepspeed.checkpointing's API), "
      "which initialize() sets from this config unless the script called "
      "checkpointing.configure(); it applies to the layers zeroshard.checkpointing.checkpoint "
      "runs (a script's own calls, PipelineModule's activation_checkpoint_interval), not to "
      "torch.utils.checkpoint's, nor to a LibTorch program's modules";
  static const auto* keys = new std::map<std::string, const char*>{
      {"pipeline.use_reentrant",
       "read by zeroshard.pipe.PipelineModule; a torch pipelining stage checkpoints in its own "
       "modules"},
      {"activation_checkpointing.partition_activations", checkpointing},
      {"activation_checkpointing.cpu_checkpointing", checkpointing},
      {"activation_checkpointing.contiguous_memory_optimization", checkpointing},
      {"activation_checkpointing.number_checkpoints", checkpointing},
      {"activation_checkpointing.synchronize_checkpoint_boundary", checkpointing},
      {"activation_checkpointing.profile", checkpointing},
  };
  return *keys;
}

const char* python_key_reason(const std::string& path) {
  const auto& keys = python_keys();
  const auto it = keys.find(path);
  return it == keys.end() ? nullptr : it->second;
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

}  // namespace zeroshard
